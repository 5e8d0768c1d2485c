"""What a rank records as it runs — events, spans, counters — and how it is written as JSON; the
layer below the communicator and the runtime, which both record into it."""
