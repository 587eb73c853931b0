"""One module per command (the (cfg) job functions the scripts run), the script runner, exits and config checks."""
