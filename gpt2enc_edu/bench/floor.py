from ._legacy import distinct_ids, minimal_bytes  # noqa: F401  (temporary while the bench package is split)
