"""A simulated MoE training job: the workload model (pure) and the job that reports it."""
