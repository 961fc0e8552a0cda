"""Plan stage: decides how tables are packed, sharded and interleaved.

Holds the sharding rules (which partition owns which id) today; the packing
planner (D-packing groups, CalcVParam shards, PICASSO Eq. 1-3) joins it.
Everything here is TensorFlow-free so that plans can be made and inspected
without building a graph.
"""
