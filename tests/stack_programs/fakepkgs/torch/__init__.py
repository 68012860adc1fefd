"""A stand-in for torch in stack tests: only torch.distributed's collectives, as blocking waits."""
