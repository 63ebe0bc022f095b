"""Statistics on timing samples: medians and their intervals, ratios, the one significance
rule, run-to-run variation, the noise flag, power-law fits, the sequential rule for claims,
and pooling over runs.

Bottom layer: pure numbers; imports nothing else of attnbench.
"""
