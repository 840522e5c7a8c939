"""The benchmark worker's loop: this package is the source, its sync twin is generated."""
