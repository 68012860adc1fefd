"""What the machine is doing: CPU, steal, other processes, the engine's processes and the ports they listen on
(`environment`), and its GPUs through NVML (`gpus`). Used by bench, experiments' contention guard, lifecycle's
start-up evidence, doctor and provenance, below all of them."""
