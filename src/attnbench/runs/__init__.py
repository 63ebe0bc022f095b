"""How a run is organised: the suite, the plan, the runner, sharding, run folders and their
files, merging, the environment. Imports ``analysis``, ``measure``, ``core``, ``stats``."""
