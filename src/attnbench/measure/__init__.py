"""How one (case, backend) pair is measured: timing, drift probe, memory, ceilings, the
worker process, profiling. Imports ``core`` and ``stats``."""
