"""tandem.router: the data plane that executes the operator's routing tables (``tandem router``).

An OpenAI-compatible asyncio front door that, per request, classifies the prompt into a pool, lets
:mod:`tandem.routing` choose the prefill/decode pair (imported unchanged, so the router and the simulator
decide identically), drives the pair's prefill leg and then its decode leg in the protocol of the pair's
vLLM KV connector, and relays the decode to the client.

Modules, each owning one thing:

- :mod:`.request`: what the router reads from a client body (prompt text, token estimate, images, stream).
- :mod:`.legs`: pure construction of the prefill and decode request bodies per connector.
- :mod:`.tables`: parsing published tables, the atomic table store, and the file table source (the
  ConfigMap watch is :mod:`tandem.adapters.routerwatch`).
- :mod:`.admission`: the router's own in-flight counts and instance choice inside a pair.
- :mod:`.metrics`: the Prometheus metrics and the separate health/metrics listener.
- :mod:`.proxy`: the request path (decide, walk, legs, relay) and the aiohttp application.
- :mod:`.cli`: ``tandem router``.

Must not: import Kubernetes clients (the ConfigMap watch lives in :mod:`tandem.adapters.routerwatch`, one
more :class:`.tables.TableSource`; the CLI imports it only when ``--namespace`` is given).
See ``docs/design/008-router.md``.
"""
