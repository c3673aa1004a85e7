"""Loaded by every Python process started with this folder on PYTHONPATH (the test fixtures in
``tests/no_network.py`` put it there): any network connection attempt fails (loopback and Unix
sockets stay allowed, since Jupyter kernels talk to Papermill over them)."""

from tests.no_network import block_network

block_network()
