package kafka

import (
	"context"
	"log/slog"

	"github.com/twmb/franz-go/pkg/kgo"
)

// kgoLogger passes franz-go's warnings and errors to slog. Its info
// messages (every join, sync, transaction begun and ended, offsets reset
// after an abort) are what an investigation of a rebalance or a fenced
// producer needs, and too many for normal running: they are passed, at
// debug level, only when the logger takes debug (LOG_LEVEL=debug).
// franz-go's own debug messages (every request) are left out.
type kgoLogger struct{ l *slog.Logger }

func (k kgoLogger) Level() kgo.LogLevel {
	if k.l.Enabled(context.Background(), slog.LevelDebug) {
		return kgo.LogLevelInfo
	}
	return kgo.LogLevelWarn
}

func (k kgoLogger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	lvl := slog.LevelWarn
	switch level {
	case kgo.LogLevelError:
		lvl = slog.LevelError
	case kgo.LogLevelInfo, kgo.LogLevelDebug:
		lvl = slog.LevelDebug
	}
	k.l.Log(context.Background(), lvl, msg, keyvals...)
}
