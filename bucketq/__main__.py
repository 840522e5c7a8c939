"""``python -m bucketq``: the same as the ``bucketq`` command."""

from .cli import main

raise SystemExit(main())
