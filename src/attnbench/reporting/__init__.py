"""How records are shown: tables, plots, findings, the report document and the index.
Imports every layer below it, never ``commands``."""

import os
import tempfile

# matplotlib writes its font cache and config under HOME unless told otherwise; a report
# must not touch the user's home folder (nor fail where HOME is empty or read-only). Set
# before any module of this package imports matplotlib; a user's own setting wins.
os.environ.setdefault("MPLCONFIGDIR", os.path.join(tempfile.gettempdir(),
                                                   f"attnbench-matplotlib-{os.getuid()}"))
