"""One place that turns a Redis URL into a client, for every role (API, gateway, workers, janitor,
`polar-mq up`, the CLI and the client-side tools).

Besides redis-py's own schemes (`redis://`, `rediss://`, `unix://`) it accepts a Sentinel-managed
primary:

    redis+sentinel://[[user]:password@]host1:port1,host2:port2/<master name>/<db>

The credentials are the data nodes' (primary and replicas); Sentinels are asked without them
unless the query names `sentinel_password` (and `sentinel_username`). TLS is asked for in the
query: `ssl=true` with redis-py's `ssl_ca_certs`, `ssl_cert_reqs`, `ssl_certfile`, `ssl_keyfile`,
`ssl_check_hostname` (any `ssl_*` option implies `ssl=true`); the Sentinels are spoken to over TLS
too unless `sentinel_ssl=false`. Any other query option is an error, not ignored (a dropped `ssl`
would have meant plain text). The client asks the
Sentinels for the primary on every new connection, and a connection that meets a demoted primary
(READONLY) is dropped and re-resolved, so every role follows a failover without a restart
(tests/store/test_sentinel.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, quote, unquote

import redis
from redis.sentinel import Sentinel, SentinelConnectionPool, SentinelManagedConnection, SentinelManagedSSLConnection

SENTINEL_SCHEME = "redis+sentinel://"
DEFAULT_SENTINEL_PORT = 26379
SSL_OPTIONS = ("ssl_ca_certs", "ssl_cert_reqs", "ssl_certfile", "ssl_keyfile", "ssl_check_hostname")
QUERY_OPTIONS = ("sentinel_username", "sentinel_password", "ssl", "sentinel_ssl", *SSL_OPTIONS)


class RedisURLError(ValueError):
    """A Redis URL this module cannot use; the message says which part is wrong."""


@dataclass(frozen=True)
class SentinelURL:
    sentinels: list[tuple[str, int]]
    master: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_username: str | None = None
    sentinel_password: str | None = None
    ssl: bool = False  # the data nodes speak TLS
    sentinel_ssl: bool = False  # the Sentinels speak TLS
    ssl_options: dict[str, Any] = field(default_factory=dict)  # redis-py's ssl_* connection options

    def ssl_kwargs(self) -> dict[str, Any]:
        """redis-py connection options for a TLS connection with this URL's ssl_* settings."""
        return {"ssl": True, **self.ssl_options}


def is_sentinel(url: str | None) -> bool:
    return bool(url) and str(url).lower().startswith(SENTINEL_SCHEME)


def _host_port(item: str) -> tuple[str, int]:
    item = item.strip()
    if item.startswith("["):  # [ipv6]:port
        host, _, rest = item[1:].partition("]")
        port = rest.lstrip(":")
    else:
        host, _, port = item.rpartition(":") if ":" in item else (item, "", "")
    if not host:
        raise RedisURLError(f"sentinel address {item!r} has no host")
    try:
        return host, int(port) if port else DEFAULT_SENTINEL_PORT
    except ValueError:
        raise RedisURLError(f"sentinel address {item!r}: port {port!r} is not a number") from None


def _flag(name: str, value: str) -> bool:
    v = value.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise RedisURLError(f"{SENTINEL_SCHEME} URL option {name}={value!r}: expected true or false")


def _ssl_query(opts: dict[str, str]) -> tuple[bool, bool, dict[str, Any]]:
    """(ssl, sentinel_ssl, ssl_* options) from the query; unknown options are refused."""
    unknown = sorted(set(opts) - set(QUERY_OPTIONS))
    if unknown:
        raise RedisURLError(f"{SENTINEL_SCHEME} URL option(s) {', '.join(unknown)} not understood "
                            f"(known: {', '.join(QUERY_OPTIONS)})")
    ssl_options: dict[str, Any] = {k: opts[k] for k in SSL_OPTIONS if k in opts}
    if "ssl_check_hostname" in ssl_options:
        ssl_options["ssl_check_hostname"] = _flag("ssl_check_hostname", ssl_options["ssl_check_hostname"])
    ssl = _flag("ssl", opts["ssl"]) if "ssl" in opts else bool(ssl_options)
    if ssl_options and not ssl:
        raise RedisURLError(f"{SENTINEL_SCHEME} URL has ssl=false but ssl_* options: drop one")
    sentinel_ssl = _flag("sentinel_ssl", opts["sentinel_ssl"]) if "sentinel_ssl" in opts else ssl
    return ssl, sentinel_ssl, ssl_options


def parse_sentinel(url: str) -> SentinelURL:
    """The parts of a `redis+sentinel://` URL (RedisURLError when one is missing or malformed)."""
    if not is_sentinel(url):
        raise RedisURLError(f"not a {SENTINEL_SCHEME} URL: {url!r}")
    rest = url[len(SENTINEL_SCHEME):]
    rest, _, query = rest.partition("?")
    netloc, _, path = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, pw = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(pw) if colon else None
        if not colon:  # "secret@host": a bare word is the password, as redis-py reads "redis://:pw@"
            username, password = None, unquote(user) or None
    sentinels = [_host_port(h) for h in hosts.split(",") if h.strip()]
    if not sentinels:
        raise RedisURLError(f"{SENTINEL_SCHEME} URL names no sentinel host: {url!r}")
    parts = [p for p in path.split("/") if p]
    if not parts:
        raise RedisURLError(f"{SENTINEL_SCHEME} URL names no master: expected "
                            f"{SENTINEL_SCHEME}host:port,host:port/<master name>/<db>")
    if len(parts) > 2:
        raise RedisURLError(f"{SENTINEL_SCHEME} URL path must be /<master name>/<db>, got /{path}")
    try:
        db = int(parts[1]) if len(parts) == 2 else 0
    except ValueError:
        raise RedisURLError(f"{SENTINEL_SCHEME} URL db {parts[1]!r} is not a number") from None
    opts = {k: v[-1] for k, v in parse_qs(query).items()}
    ssl, sentinel_ssl, ssl_options = _ssl_query(opts)
    return SentinelURL(sentinels=sentinels, master=unquote(parts[0]), db=db, username=username,
                       password=password, sentinel_username=opts.get("sentinel_username"),
                       sentinel_password=opts.get("sentinel_password"), ssl=ssl, sentinel_ssl=sentinel_ssl,
                       ssl_options=ssl_options)


def sentinel_for(parsed: SentinelURL, **kwargs: Any) -> Sentinel:
    skw: dict[str, Any] = {k: v for k, v in kwargs.items() if k.startswith("socket_")}
    if parsed.sentinel_password:
        skw["password"] = parsed.sentinel_password
        if parsed.sentinel_username:
            skw["username"] = parsed.sentinel_username
    if parsed.sentinel_ssl:
        skw.update(parsed.ssl_kwargs())
    return Sentinel(parsed.sentinels, sentinel_kwargs=skw, **kwargs)


class FollowingConnection(SentinelManagedConnection):
    """A connection to the Sentinel-managed primary that asks the Sentinels for the primary on
    every reconnect attempt. redis-py's send path reconnects with `connect_check_health`, whose
    retries keep the address of the last primary: a command in flight when the primary died then
    retried the dead address for the whole ride-out budget and failed (a run stage's transition;
    its session then ran twice). tests/store/test_sentinel.py::
    test_a_connection_cut_mid_command_follows_the_new_primary guards it."""

    def connect_check_health(self, check_health: bool = True, retry_socket_connect: bool = True) -> None:
        if self._sock is not None or not retry_socket_connect or not self.connection_pool.is_master:
            return super().connect_check_health(check_health=check_health, retry_socket_connect=retry_socket_connect)
        self.retry.call_with_retry(lambda: self._connect_to_primary(check_health), lambda error: None)

    def _connect_to_primary(self, check_health: bool) -> None:
        self.host, self.port = self.connection_pool.get_master_address()
        super().connect_check_health(check_health=check_health, retry_socket_connect=False)


class FollowingSSLConnection(FollowingConnection, SentinelManagedSSLConnection):
    """FollowingConnection over TLS (a `redis+sentinel://...?ssl=true` URL)."""


class BlockingSentinelPool(SentinelConnectionPool, redis.BlockingConnectionPool):
    """A Sentinel pool whose callers wait for a free connection (the gateway's pool kind)."""


def client(url: str, *, blocking_pool: bool = False, max_connections: int | None = None,
           pool_timeout: float = 10.0, **kwargs: Any) -> redis.Redis:
    """A redis-py client for `url` (any scheme above); `kwargs` are redis-py connection options
    (timeouts, retry, health_check_interval). `blocking_pool`: callers wait up to `pool_timeout`
    for one of `max_connections` instead of failing past the pool's size."""
    if not is_sentinel(url):
        if blocking_pool:
            pool = redis.BlockingConnectionPool.from_url(url, max_connections=max_connections or 512,
                                                         timeout=pool_timeout, **kwargs)
            return redis.Redis(connection_pool=pool)
        if max_connections is not None:
            kwargs["max_connections"] = max_connections
        return redis.Redis.from_url(url, **kwargs)
    parsed = parse_sentinel(url)
    sentinel_kwargs = {k: v for k, v in kwargs.items() if k.startswith("socket_")}
    master_kwargs = dict(kwargs)
    master_kwargs["db"] = parsed.db
    if parsed.password is not None:
        master_kwargs["password"] = parsed.password
    if parsed.username is not None:
        master_kwargs["username"] = parsed.username
    if max_connections is not None:
        master_kwargs["max_connections"] = max_connections
    connection_class: type[FollowingConnection] = FollowingConnection
    if parsed.ssl:
        connection_class = FollowingSSLConnection
        master_kwargs.update(parsed.ssl_options)
    pool_class: type[SentinelConnectionPool] = SentinelConnectionPool
    if blocking_pool:
        pool_class = BlockingSentinelPool
        master_kwargs.setdefault("max_connections", 512)
        master_kwargs["timeout"] = pool_timeout
    sentinel = sentinel_for(parsed, **sentinel_kwargs)
    return sentinel.master_for(parsed.master, connection_pool_class=pool_class, connection_class=connection_class,
                               **master_kwargs)


def uses_sentinel(r: Any) -> bool:
    """Whether `r` (a redis-py client) follows a Sentinel-managed primary."""
    return isinstance(getattr(r, "connection_pool", None), SentinelConnectionPool)


@dataclass(frozen=True)
class CeleryBroker:
    """What Celery needs for one Redis URL: `broker_url`, `broker_transport_options` entries and
    `broker_use_ssl` (None: plain text, or TLS read from a rediss:// URL by kombu itself)."""
    url: str
    transport_options: dict[str, Any] = field(default_factory=dict)
    use_ssl: dict[str, Any] | None = None


def celery_broker(url: str) -> CeleryBroker:
    """The URL itself for redis-py schemes; for a Sentinel URL kombu's
    `sentinel://h1:p1;sentinel://h2:p2` form plus `master_name` (and `sentinel_kwargs` when the
    Sentinels need a password or TLS), and `broker_use_ssl` when the data nodes speak TLS."""
    if not is_sentinel(url):
        return CeleryBroker(url)
    parsed = parse_sentinel(url)
    auth = ""
    if parsed.password is not None:
        auth = f"{quote(parsed.username or '', safe='')}:{quote(parsed.password, safe='')}@"
    hosts = [f"[{h}]" if ":" in h else h for h, _ in parsed.sentinels]
    broker = ";".join(f"sentinel://{auth}{h}:{p}/{parsed.db}"
                      for h, (_, p) in zip(hosts, parsed.sentinels))
    options: dict[str, Any] = {"master_name": parsed.master}
    sentinel_kwargs: dict[str, Any] = {}
    if parsed.sentinel_password:
        sentinel_kwargs["password"] = parsed.sentinel_password
        if parsed.sentinel_username:
            sentinel_kwargs["username"] = parsed.sentinel_username
    if parsed.sentinel_ssl:
        sentinel_kwargs.update(parsed.ssl_kwargs())
    if sentinel_kwargs:
        options["sentinel_kwargs"] = sentinel_kwargs
    # kombu: Connection(ssl={ssl_* options}) picks SentinelManagedSSLConnection for the primary
    use_ssl = {"ssl_cert_reqs": "required", **parsed.ssl_options} if parsed.ssl else None
    return CeleryBroker(broker, options, use_ssl)


def describe(url: str) -> str:
    """`url` without its password (for logs and `polar-mq up`'s summary)."""
    if is_sentinel(url):
        p = parse_sentinel(url)
        hosts = ",".join(f"{h}:{port}" for h, port in p.sentinels)
        auth = "***@" if p.password else ""
        return f"{SENTINEL_SCHEME}{auth}{hosts}/{p.master}/{p.db}"
    try:
        from urllib.parse import urlsplit, urlunsplit

        parts = urlsplit(url)
        if parts.password:
            host = parts.hostname or ""
            netloc = f"{parts.username or ''}:***@{host}{f':{parts.port}' if parts.port else ''}"
            return urlunsplit(parts._replace(netloc=netloc))
    except ValueError:
        pass
    return url
