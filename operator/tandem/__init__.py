"""Tandem: a Kubernetes operator for disaggregated (prefill/decode) LLM inference fleets on AMD GPUs.

The import package lives under ``operator/`` (the source root) and is named ``tandem`` because a
package named ``operator`` would shadow Python's standard library module of that name.
"""

__version__ = "0.1.0.dev0"
GROUP = "tandem.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
