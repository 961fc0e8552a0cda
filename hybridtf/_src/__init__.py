"""Private implementation of hybridtf. Import the public API from ``hybridtf``."""
