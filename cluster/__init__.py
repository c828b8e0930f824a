"""Render and submit the pipeline's stages as Slurm batch jobs and Kubernetes workloads (``python -m cluster``)."""
