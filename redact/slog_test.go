package redact

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
)

func TestHandlerRedactsLogLines(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	log := slog.New(NewHandler(slog.NewJSONHandler(&buf, nil)))
	key := "AKIA" + "ABCDEFGHIJKLMNOP"
	log = log.With(slog.String("bound", "id "+key))
	log.Info("saw "+key, slog.String("s", key), slog.Any("error", fmt.Errorf("open /work/out/%s.txt: %w", key, errors.ErrUnsupported)),
		slog.Group("g", slog.String("name", key)), slog.Int("n", 3))
	if strings.Contains(buf.String(), key) || strings.Count(buf.String(), Replacement(KindAWSAccessKey)) != 5 {
		t.Fatalf("log line: %s", buf.String())
	}
	if !strings.Contains(buf.String(), `"n":3`) {
		t.Fatalf("other attributes lost: %s", buf.String())
	}
}
