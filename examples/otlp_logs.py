"""Send Python logging records to ``bucketq serve`` through OpenTelemetry's own OTLP/HTTP
exporter, unchanged: the exporter reads its endpoint and headers from the environment.

    OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:8080 \
    OTEL_EXPORTER_OTLP_HEADERS="x-api-key=$KEY" python examples/otlp_logs.py

Needs OpenTelemetry's SDK and OTLP/HTTP exporter: ``pip install -e ".[otel]"`` in a
checkout (the test extra has them too). The record arrives as service ``checkout``, level ``warn``,
message ``cart abandoned``, metadata ``{"cart": 42, ...}``.
"""

import logging

from opentelemetry._logs import set_logger_provider
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
from opentelemetry.sdk._logs import LoggerProvider, LoggingHandler
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
from opentelemetry.sdk.resources import Resource

provider = LoggerProvider(resource=Resource.create({"service.name": "checkout"}))
provider.add_log_record_processor(BatchLogRecordProcessor(OTLPLogExporter()))
set_logger_provider(provider)
logging.getLogger().addHandler(LoggingHandler(logger_provider=provider))

logging.getLogger("checkout").warning("cart abandoned", extra={"cart": 42})
provider.shutdown()  # sends what is batched before the process ends
