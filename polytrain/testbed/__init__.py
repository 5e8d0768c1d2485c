"""The emulated cluster: hosts as network namespaces on this machine, links shaped to a rate and
delay, one torchrun agent per host (``polytrain testbed``)."""
