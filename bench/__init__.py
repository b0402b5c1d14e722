"""The benchmark: stepwarden and its peers on the same workload (see README.md)."""
