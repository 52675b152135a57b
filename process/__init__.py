"""Process plumbing shared by the server and the shim: flags generated from settings dataclasses, descriptor
limits, bounded logging and the access log."""
