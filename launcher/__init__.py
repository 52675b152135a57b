"""The `sluice` command and the supervision of child processes that `sluice up`, bench/ and tests share."""
