"""Process hygiene shared by the server and the shim: descriptor limits and bounded logging."""
