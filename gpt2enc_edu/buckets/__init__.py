"""The bucket table, the deterministic wte kernels' input, in a room of its own.

* ``host``: the table (``BucketTable``) and its order, built with NumPy (``build_bucket_table``), compared
  (``same_table``) and reordered (``reorder_buckets``);
* ``device``: the table in GPU memory (``DeviceBucketTable``), the bounds it is sized by, ``to_device``;
* ``gpu``: the table built on the GPU by one of three routes (``build_bucket_table_gpu``, ``bucketing_route``),
  and what each route's phases cost (``phase_times_us``);
* ``mirror_small``, ``mirror_scatter``, ``mirror_cooperative``: the NumPy twins of the three routes' kernels
  (``kernels/bucketing_small.cu``, ``bucketing_scatter.cu``, ``bucketing.cu``), each giving the same table.

The room imports the package's layout, loader and generic checks, never the API, the validation or the launchers
above it. The names below are the ones the rest of the package and its users take from here.
"""

from . import device, gpu, host, mirror_cooperative, mirror_scatter, mirror_small
from .device import DeviceBucketTable, max_multi_chunk_units, to_device
from .gpu import bucketing_route, build_bucket_table_gpu
from .host import BUCKET_ORDERS, BucketTable, build_bucket_table, reorder_buckets, same_table

__all__ = [
    "BUCKET_ORDERS",
    "device",
    "gpu",
    "host",
    "mirror_cooperative",
    "mirror_scatter",
    "mirror_small",
    "BucketTable",
    "DeviceBucketTable",
    "bucketing_route",
    "build_bucket_table",
    "build_bucket_table_gpu",
    "max_multi_chunk_units",
    "reorder_buckets",
    "same_table",
    "to_device",
]
