"""What a case and a record are: cases, masks, dtypes, metrics, the record, the backend
interface and registry, the float64 reference. Imports only ``attnbench.stats``."""
