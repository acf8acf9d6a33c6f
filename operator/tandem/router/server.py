"""Running the router: the table sources, the request listener and the health/metrics listener.

Owns start-up order (tables first, so the router never serves without having tried them; health listener;
request listener) and shutdown. :func:`start_router` is what the CLI and the component tests use.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from aiohttp import web

from tandem.router.admission import Loads
from tandem.router.drainreport import add_streams_route
from tandem.router.metrics import HealthListener, RouterMetrics, build_health_app
from tandem.router.proxy import Router, RouterConfig
from tandem.router.tables import TableSource, TableStore

log = logging.getLogger(__name__)


@dataclass
class RunningRouter:
    """A started router: its ports, store and router, and how to stop it."""

    router: Router
    store: TableStore
    runner: web.AppRunner
    port: int
    health: HealthListener | None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    @property
    def metrics_port(self) -> int | None:
        return None if self.health is None else self.health.port

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.runner.cleanup()
        await self.router.scraper.close()
        if self.health is not None:
            self.health.stop()


async def start_router(
    sources: Sequence[TableSource],
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    metrics_host: str = "127.0.0.1",
    metrics_port: int | None = 0,
    config: RouterConfig | None = None,
) -> RunningRouter:
    """Load tables, start both listeners (port 0: an ephemeral port), the source loops and the engine
    scraper (its first round before returning)."""
    store = TableStore()
    metrics = RouterMetrics(store)
    for source in sources:
        source.load_once(store)
    loads = Loads()
    health: HealthListener | None = None
    if metrics_port is not None:
        app = build_health_app(metrics, store)
        add_streams_route(app, store, loads)  # the operator's drain loop reads it (tandem.core.drains)
        health = HealthListener(app, metrics_host, metrics_port)
    router = Router(store, metrics, config, loads)
    scraping = router.config.scrape_interval_s > 0
    if scraping:
        # One round before serving (bounded by the scrape timeout): admission starts with an engine view.
        await router.scraper.scrape_once()
    runner = web.AppRunner(router.build_app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    if health is not None:
        # Only now: `/ready` must not answer before the request listener accepts (the first scrape round
        # above takes up to the scrape timeout, and a client that trusted `/ready` got a refused connection).
        health.start()
    bound = port
    for address in runner.addresses:
        bound = int(address[1])
        break
    running = RunningRouter(router=router, store=store, runner=runner, port=bound, health=health)
    running.tasks = [asyncio.create_task(source.run(store)) for source in sources]
    if scraping:
        running.tasks.append(asyncio.create_task(router.scraper.run()))
    log.info("tandem router on %s:%d (%d table(s) live)", host, bound, len(store.snapshot))
    return running
