"""The `/healthz` prober of `kvcentric bench admission --load mixed`, in a process of its
own so that the clients' event loop does not delay its timings; standard library only, so
the process starts fast."""

import http.client
import time
import urllib.parse
from typing import Any


def probe_health(pipe: Any) -> None:
    """Say "ready", receive (url, period_s, start_at, duration_s) (start_at in time.time()),
    GET the url every period_s from start_at for duration_s on one keep-alive connection,
    and send back [(status, seconds), ...]."""
    pipe.send("ready")
    url, period_s, start_at, duration_s = pipe.recv()
    parsed = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=30)
    results: list[tuple[str, float]] = []
    time.sleep(max(0.0, start_at - time.time()))
    until = start_at + duration_s
    while (start := time.time()) < until:
        try:
            connection.request("GET", parsed.path)
            response = connection.getresponse()
            response.read()
            status = str(response.status)
        except (OSError, http.client.HTTPException) as error:
            status = f"error:{type(error).__name__}"
            connection.close()
        results.append((status, time.time() - start))
        time.sleep(max(0.0, period_s - (time.time() - start)))
    pipe.send(results)
    pipe.close()
