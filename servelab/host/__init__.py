"""What the machine is doing: CPU, steal, other processes, the engine's processes and the ports they listen on
(`environment`). Used by bench, experiments' contention guard, doctor and provenance, below all of them."""
