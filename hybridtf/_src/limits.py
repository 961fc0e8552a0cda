"""Size limits shared by the Python checks: every size and count reaches int64 op attributes and shapes."""

INT64_MAX = 2**63 - 1
