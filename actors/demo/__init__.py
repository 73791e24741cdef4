"""The demo agent, the default of ``turnstile serve`` when no model is configured: a few
requests in English and French carried out through the same tool calls a model would make
(``actors.demo.agent``; what it reads: ``actors.demo.phrases``)."""

from turnstile.actors.demo.agent import HELP, DemoAgent
from turnstile.actors.demo.phrases import Request, read_request

__all__ = ["DemoAgent", "HELP", "Request", "read_request"]
