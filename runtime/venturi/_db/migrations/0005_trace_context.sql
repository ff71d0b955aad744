-- The W3C trace context (`traceparent`) an enqueue ran under, when the producer traces
-- (venturi.otel): the worker's span of each run links to it. NULL for every job enqueued
-- without tracing; adding a nullable column without a default rewrites nothing.
ALTER TABLE {prefix}_jobs ADD COLUMN trace_context text;
