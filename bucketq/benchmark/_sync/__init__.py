# GENERATED from bucketq/benchmark/_async/__init__.py by scripts/unasync.py. Do not edit;
# edit the async file and run `python scripts/unasync.py`.
"""The benchmark worker's loop: this package is the source, its sync twin is generated."""
