# SPDX-License-Identifier: Apache-2.0
"""A stand-in for the vLLM package, for the tests of shmbroker's vLLM plugin
(tests/python/test_vllm_plugin.py): its modules sit at vLLM's paths, load
general plugins through entry points as vLLM does, and define the classes
the plugin replaces with vLLM's public interfaces (the methods and their
parameters) but none of their work. Nothing here is vLLM's code."""
