"""A node's metrics: counters, histograms and read-at-scrape gauges on a registry of its own.

Built on ``prometheus_client`` (the reference client: its text format, its histogram buckets,
its label handling) but never on its global ``REGISTRY``: tests and embedders run several nodes
in one process, and each node's ``/metrics`` must show that node only. ``Metrics.render`` is
``generate_latest`` over the node's ``CollectorRegistry``.

Series are declared by the part of the node that owns them (``counter`` / ``histogram`` with
their help text and label names, ``gauge`` with a function read at every scrape); ``inc`` and
``observe`` on a name nobody declared declare it then, with the labels given, so a forgotten
declaration costs a help text, never a request. Label values must come from small fixed sets
(a status, a source, a configured hook's name): never a session, user or input id, which would
make a series per id.

Counters leave out the ``_created`` samples ``prometheus_client`` adds by default: they double
the output and no dashboard of ours reads them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

__all__ = ["CONTENT_TYPE", "LATENCY_BUCKETS", "Metrics"]

#: The media type of ``Metrics.render``'s output (the Prometheus text format 0.0.4).
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4

#: Buckets (seconds) for latencies from a millisecond to a few minutes.
LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
)


class Metrics:
    """The metrics of one node.

    Attributes:
        registry: the node's own ``CollectorRegistry`` (for ``generate_latest``, or to add a
            collector of one's own).
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self._counters: dict[str, Counter] = {}
        self._histograms: dict[str, Histogram] = {}
        self._gauges: dict[str, tuple[str, Callable[[], float]]] = {}
        self._labels: dict[str, tuple[str, ...]] = {}
        self.registry.register(_Collector(self))

    # -- declaring --

    def counter(self, name: str, help: str, labels: Sequence[str] = ()) -> None:
        """Declare a counter (its name ends in ``_total``); declaring it again is a no-op.

        Raises:
            ValueError: the name is taken by another kind of series, or by the same counter
                with other labels.
        """
        if name in self._counters:
            self._same_labels(name, labels)
            return
        self._free(name)
        if not name.endswith("_total"):
            raise ValueError(f"counter name must end in _total, got {name!r}")
        self._counters[name] = Counter(name, help, tuple(labels), registry=None)
        self._labels[name] = tuple(labels)

    def histogram(
        self,
        name: str,
        help: str,
        labels: Sequence[str] = (),
        buckets: Sequence[float] = LATENCY_BUCKETS,
    ) -> None:
        """Declare a histogram (``name_bucket``, ``name_sum``, ``name_count``); declaring it
        again is a no-op.

        Raises:
            ValueError: the name is taken by another kind of series, or by the same histogram
                with other labels.
        """
        if name in self._histograms:
            self._same_labels(name, labels)
            return
        self._free(name)
        self._histograms[name] = Histogram(
            name, help, tuple(labels), registry=None, buckets=tuple(buckets)
        )
        self._labels[name] = tuple(labels)

    def gauge(self, name: str, read: Callable[[], float], help: str = "") -> None:
        """Report ``read()`` under ``name`` at every scrape (a counter when the name ends in
        ``_total``: a count kept elsewhere, e.g. crash reports). Declaring it again replaces
        the function (a node started again in the same process)."""
        if name not in self._gauges:
            self._free(name)
        self._gauges[name] = (help or name.replace("_", " "), read)

    # -- recording --

    def inc(self, name: str, amount: float = 1.0, **labels: str) -> None:
        """Add ``amount`` to a counter (declared now if nobody did, with these labels)."""
        counter = self._counters.get(name)
        if counter is None:
            self.counter(name, name.replace("_", " "), tuple(labels))
            counter = self._counters[name]
        (counter.labels(**labels) if labels else counter).inc(amount)

    def observe(self, name: str, value: float, **labels: str) -> None:
        """Record one observation (seconds, for a latency) in a histogram (declared now if
        nobody did, with these labels)."""
        histogram = self._histograms.get(name)
        if histogram is None:
            self.histogram(name, name.replace("_", " "), tuple(labels))
            histogram = self._histograms[name]
        (histogram.labels(**labels) if labels else histogram).observe(value)

    # -- reading --

    def value(self, name: str, **labels: str) -> float:
        """A counter's value, a histogram's count of observations, or a gauge's reading; 0 for
        a series never recorded."""
        if name in self._gauges:
            return float(self._gauges[name][1]())
        wanted = {k: str(v) for k, v in labels.items()}
        if name in self._counters:
            families, sample_name = self._counters[name].collect(), name
        elif name in self._histograms:
            families, sample_name = self._histograms[name].collect(), f"{name}_count"
        else:
            return 0.0
        for family in families:
            for sample in family.samples:
                if sample.name == sample_name and sample.labels == wanted:
                    return sample.value
        return 0.0

    def snapshot(self) -> dict[str, float]:
        """Every sample by its exposition name (labels inline and sorted, as a scrape shows
        them: ``x_total{source="user",status="failed"}``)."""
        out: dict[str, float] = {}
        for family in self.registry.collect():
            for sample in family.samples:
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
                out[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
        return out

    def render(self) -> bytes:
        """The registry in the Prometheus text format (``CONTENT_TYPE``)."""
        return generate_latest(self.registry)

    # -- internals --

    def _free(self, name: str) -> None:
        if name in self._counters or name in self._histograms or name in self._gauges:
            raise ValueError(f"metric {name!r} is already declared as another kind")

    def _same_labels(self, name: str, labels: Sequence[str]) -> None:
        if tuple(labels) != self._labels[name]:
            raise ValueError(
                f"metric {name!r} has labels {list(self._labels[name])}, not {list(labels)}"
            )

    def _families(self) -> Iterable[Metric]:
        for metric in (*self._counters.values(), *self._histograms.values()):
            for family in metric.collect():
                family.samples = [s for s in family.samples if not s.name.endswith("_created")]
                yield family
        for name, (help, read) in self._gauges.items():
            if name.endswith("_total"):
                yield CounterMetricFamily(name, help, value=float(read()))
            else:
                yield GaugeMetricFamily(name, help, value=float(read()))


class _Collector:
    """What the registry scrapes: every series of one ``Metrics``."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterable[Metric]:
        return self._metrics._families()

    def describe(self) -> list[Metric]:
        return []  # names are not fixed up front: no clash checks against other collectors
