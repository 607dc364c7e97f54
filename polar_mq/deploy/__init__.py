"""Starting the polar_mq roles on cluster schedulers (`polar-mq deploy slurm`)."""
