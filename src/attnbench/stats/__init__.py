"""Statistics on timing samples: medians and their intervals, ratios, power-law fits.

Bottom layer: pure numbers; imports nothing else of attnbench.
"""
