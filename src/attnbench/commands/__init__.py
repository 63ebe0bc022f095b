"""The command line's commands, one module each: its parser (``add_parser``) and its handler.

Top layer: may import every layer below; nothing in attnbench imports it but ``cli``.
"""
