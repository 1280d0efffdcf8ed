"""What the project writes to a Kubernetes cluster, beside the core's reading of it (core/devices/kubernetes.py)."""
