"""ConfigError, in a module of its own: every part that refuses a setting raises it (an agent's
`from_config`, the Qwen loader, checkpoints), and importing it costs nothing."""


class ConfigError(ValueError):
    """An impossible or unsupported configuration; the message says which flag to change."""
