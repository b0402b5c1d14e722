"""The peers' side of the "order" workload: the apps that their own workers import."""
