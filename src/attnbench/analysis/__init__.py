"""What is concluded from records: claims, comparisons, changes between runs, a
recommendation. Imports ``core`` and ``stats``; knows nothing of how runs are executed."""
