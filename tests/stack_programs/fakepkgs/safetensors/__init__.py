"""A stand-in for safetensors in stack tests."""
