"""Plan stage: decides how tables are packed (PICASSO §III-B), sharded and interleaved (§III-C).

* ``tables.py``: table specs and packed-table records;
* ``stats.py``: warm-up id statistics and CalcVParam (PICASSO Eq. 1);
* ``packing.py``: D-packing groups, CalcVParam shards, the JSON packing plan;
* ``sharding.py``: which partition (rank) owns which id;
* ``interleaving.py``: K-interleaving groups by Capacity_g (Eq. 3) and the
  micro-batch size (Eq. 2), from warm-up costs; the JSON interleaving plan.

Everything here is TensorFlow-free so that plans can be made and inspected
without building a graph.
"""
