"""A stand-in package for stack tests: real module paths, tiny bodies (tests/stack_programs/README)."""
