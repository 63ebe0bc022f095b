"""How records are shown: tables, plots, findings, the report document and the index.
Imports every layer below it, never ``commands``."""
