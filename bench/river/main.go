// The River adapter: the harness's adapter protocol (bench/adapters/base.py) for River, the Go
// job queue, through its public API only.
//
//	river-adapter [-fetch-cooldown D] [-fetch-poll-interval D] {control|worker} --dsn DSN ...
//
// Same roles, commands, events and timings file as the Python adapters, so the orchestrator
// cannot tell them apart: "control" reads one JSON command per line on stdin and answers one
// JSON line on stdout; "worker" runs a River client whose no-op workers record (enqueued_at,
// started_at) in memory, writes "ready"/"reached"/"stopped" events and stops on a "stop" line
// or EOF. Timestamps are wall-clock seconds (CLOCK_REALTIME, as Python's time.time()).
//
// Set-up, as River's docs show it: a pgxpool.Pool (its defaults) under riverpgxv5, the schema
// from rivermigrate (what `river migrate-up` runs), one client with the default queue at
// MaxWorkers = concurrency. FetchCooldown and FetchPollInterval are River's defaults (100 ms,
// 1 s) unless given; the control client gets the same values, because River rate-limits its
// insert notifications per queue by the inserting client's FetchCooldown.
package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"os"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

const preloadBatch = 1000 // largest batch handed to InsertManyFast while preloading

// now is the one clock, as bench/harness.py's: wall time in seconds.
func now() float64 { return float64(time.Now().UnixNano()) / 1e9 }

// --- job kinds: noop0 .. noop19, one Go type each (River keys workers by the args type) ------

type kindName interface{ name() string }

type NoopArgs[K kindName] struct {
	EnqueuedAt float64 `json:"enqueued_at"`
}

func (NoopArgs[K]) Kind() string { var k K; return k.name() }

type NoopWorker[K kindName] struct {
	river.WorkerDefaults[NoopArgs[K]]
	rec *recorder
}

func (w *NoopWorker[K]) Work(ctx context.Context, job *river.Job[NoopArgs[K]]) error {
	w.rec.record(job.Args.EnqueuedAt)
	return nil
}

type kind struct {
	args     func(enqueuedAt float64) river.JobArgs
	register func(workers *river.Workers, rec *recorder)
}

func kindOf[K kindName]() kind {
	return kind{
		args: func(t float64) river.JobArgs { return NoopArgs[K]{EnqueuedAt: t} },
		register: func(workers *river.Workers, rec *recorder) {
			river.AddWorker(workers, &NoopWorker[K]{rec: rec})
		},
	}
}

type k0 struct{}
type k1 struct{}
type k2 struct{}
type k3 struct{}
type k4 struct{}
type k5 struct{}
type k6 struct{}
type k7 struct{}
type k8 struct{}
type k9 struct{}
type k10 struct{}
type k11 struct{}
type k12 struct{}
type k13 struct{}
type k14 struct{}
type k15 struct{}
type k16 struct{}
type k17 struct{}
type k18 struct{}
type k19 struct{}

func (k0) name() string  { return "noop0" }
func (k1) name() string  { return "noop1" }
func (k2) name() string  { return "noop2" }
func (k3) name() string  { return "noop3" }
func (k4) name() string  { return "noop4" }
func (k5) name() string  { return "noop5" }
func (k6) name() string  { return "noop6" }
func (k7) name() string  { return "noop7" }
func (k8) name() string  { return "noop8" }
func (k9) name() string  { return "noop9" }
func (k10) name() string { return "noop10" }
func (k11) name() string { return "noop11" }
func (k12) name() string { return "noop12" }
func (k13) name() string { return "noop13" }
func (k14) name() string { return "noop14" }
func (k15) name() string { return "noop15" }
func (k16) name() string { return "noop16" }
func (k17) name() string { return "noop17" }
func (k18) name() string { return "noop18" }
func (k19) name() string { return "noop19" }

var kinds = []kind{
	kindOf[k0](), kindOf[k1](), kindOf[k2](), kindOf[k3](), kindOf[k4](),
	kindOf[k5](), kindOf[k6](), kindOf[k7](), kindOf[k8](), kindOf[k9](),
	kindOf[k10](), kindOf[k11](), kindOf[k12](), kindOf[k13](), kindOf[k14](),
	kindOf[k15](), kindOf[k16](), kindOf[k17](), kindOf[k18](), kindOf[k19](),
}

// --- protocol output -------------------------------------------------------------------------

type emitter struct {
	mu  sync.Mutex
	out *os.File
}

func (e *emitter) emit(v map[string]any) {
	line, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.out.Write(append(line, '\n'))
}

// --- the recorder (bench/harness.py's JobRecorder) -------------------------------------------

type recorder struct {
	mu       sync.Mutex
	pairs    []float64
	count    int
	notifyAt int
	stopAt   int
	out      *emitter
	stop     func()
}

func (r *recorder) record(enqueuedAt float64) {
	r.mu.Lock()
	r.pairs = append(r.pairs, enqueuedAt, now())
	r.count++
	count := r.count
	r.mu.Unlock()
	if count == r.notifyAt {
		r.out.emit(map[string]any{"event": "reached", "count": count, "t": now()})
	}
	if count == r.stopAt {
		r.stop()
	}
}

func (r *recorder) save(path string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	fh, err := os.Create(path)
	if err != nil {
		return err
	}
	defer fh.Close()
	// array('d') on this machine: native (little-endian) doubles, pairs back to back.
	buf := bufio.NewWriter(fh)
	if err := binary.Write(buf, binary.LittleEndian, r.pairs); err != nil {
		return err
	}
	return buf.Flush()
}

// --- shared set-up ---------------------------------------------------------------------------

type options struct {
	fetchCooldown     time.Duration
	fetchPollInterval time.Duration
	dsn               string
	concurrency       int
	kinds             int
	notifyAt          int
	stopAt            int
	timings           string
}

func logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

func baseConfig(opts options) *river.Config {
	return &river.Config{
		FetchCooldown:     opts.fetchCooldown,     // zero: River's default
		FetchPollInterval: opts.fetchPollInterval, // zero: River's default
		Logger:            logger(),
	}
}

// --- control role ----------------------------------------------------------------------------

type control struct {
	pool   *pgxpool.Pool
	client *river.Client[pgx.Tx]
}

func (c *control) sqlValue(ctx context.Context, query string) (any, error) {
	rows, err := c.pool.Query(ctx, query)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var value any
	if rows.Next() {
		values, err := rows.Values()
		if err != nil {
			return nil, err
		}
		if len(values) > 0 {
			value = values[0]
		}
	}
	return value, rows.Err()
}

func (c *control) exec(ctx context.Context, query string) error {
	_, err := c.pool.Exec(ctx, query)
	return err
}

func (c *control) count(ctx context.Context) (int64, error) {
	var n int64
	err := c.pool.QueryRow(ctx, "SELECT count(*) FROM river_job").Scan(&n)
	return n, err
}

func (c *control) insertMany(ctx context.Context, k int, count int, enqueuedAt float64) error {
	params := make([]river.InsertManyParams, count)
	for i := range params {
		params[i] = river.InsertManyParams{Args: kinds[k].args(enqueuedAt)}
	}
	_, err := c.client.InsertManyFast(ctx, params)
	return err
}

func num(req map[string]any, key string) float64 {
	v, _ := req[key].(float64)
	return v
}

func (c *control) handle(ctx context.Context, req map[string]any) (map[string]any, error) {
	switch req["cmd"] {
	case "info":
		return map[string]any{"versions": versions()}, nil
	case "install":
		migrator, err := rivermigrate.New(riverpgxv5.New(c.pool), &rivermigrate.Config{Logger: logger()})
		if err != nil {
			return nil, err
		}
		_, err = migrator.Migrate(ctx, rivermigrate.DirectionUp, nil)
		return map[string]any{}, err
	case "enqueue":
		n, batch := int(num(req, "n")), int(num(req, "batch"))
		started := time.Now()
		switch req["mode"] {
		case "sequential":
			for i := 0; i < n; i++ {
				if _, err := c.client.Insert(ctx, kinds[0].args(now()), nil); err != nil {
					return nil, err
				}
			}
		case "bulk":
			for offset := 0; offset < n; offset += batch {
				if err := c.insertMany(ctx, 0, min(batch, n-offset), now()); err != nil {
					return nil, err
				}
			}
		default:
			return nil, fmt.Errorf("unknown enqueue mode %v", req["mode"])
		}
		return map[string]any{"seconds": time.Since(started).Seconds(), "jobs": n}, nil
	case "pace":
		// One job every 1/rate s against an absolute schedule (no coordinated omission).
		rate, seconds := num(req, "rate"), num(req, "seconds")
		total := int(math.Round(rate * seconds))
		start := now() + 0.05
		maxLag := 0.0
		for i := 0; i < total; i++ {
			delay := start + float64(i)/rate - now()
			if delay > 0 {
				time.Sleep(time.Duration(delay * 1e9))
			} else {
				maxLag = math.Max(maxLag, -delay)
			}
			if _, err := c.client.Insert(ctx, kinds[0].args(now()), nil); err != nil {
				return nil, err
			}
		}
		return map[string]any{"jobs": total, "max_lag_ms": maxLag * 1000}, nil
	case "preload":
		return c.preload(ctx, int(num(req, "total")), int(num(req, "kinds")), int(num(req, "template_per_kind")))
	case "checkpoint":
		return map[string]any{}, c.exec(ctx, "CHECKPOINT")
	case "wait_drained":
		limit, poll := num(req, "limit_s"), num(req, "poll_s")
		deadline := time.Now().Add(time.Duration(limit * 1e9))
		polls := 0
		for {
			var outstanding bool
			err := c.pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM river_job WHERE state IN "+
				"('available', 'pending', 'running', 'retryable', 'scheduled'))").Scan(&outstanding)
			if err != nil {
				return nil, err
			}
			if !outstanding {
				return map[string]any{"t_done": now(), "polls": polls}, nil
			}
			polls++
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("jobs still outstanding after %.0fs", limit)
			}
			time.Sleep(time.Duration(poll * 1e9))
		}
	case "stats":
		return map[string]any{"unsupported": "River's client has no queue-statistics call " +
			"(JobList pages through jobs; counts per state are River UI's own SQL)"}, nil
	}
	return nil, fmt.Errorf("unknown command %v", req["cmd"])
}

// preload mirrors Control.cmd_preload in bench/adapters/base.py: the API writes a template,
// one INSERT ... SELECT clones it up to total rows, filled tables are analysed, CHECKPOINT.
func (c *control) preload(ctx context.Context, total, nKinds, templatePerKind int) (map[string]any, error) {
	started := time.Now()
	perKind := max(1, min(templatePerKind, total/nKinds))
	for k := 0; k < nKinds; k++ {
		for offset := 0; offset < perKind; offset += preloadBatch {
			if err := c.insertMany(ctx, k, min(preloadBatch, perKind-offset), now()); err != nil {
				return nil, err
			}
		}
	}
	have, err := c.count(ctx)
	if err != nil {
		return nil, err
	}
	if missing := int64(total) - have; missing > 0 {
		raw, err := c.sqlValue(ctx, "SELECT coalesce(json_agg(column_name ORDER BY ordinal_position), '[]')::text "+
			"FROM information_schema.columns WHERE table_name = 'river_job' AND table_schema = current_schema() "+
			"AND is_identity = 'NO' AND is_generated = 'NEVER' "+
			"AND left(coalesce(column_default, ''), 8) <> 'nextval('")
		if err != nil {
			return nil, err
		}
		var columns []string
		if err := json.Unmarshal([]byte(raw.(string)), &columns); err != nil {
			return nil, err
		}
		sources := make([]string, len(columns))
		for i, col := range columns {
			sources[i] = "t." + col
		}
		copies := (missing + have - 1) / have
		err = c.exec(ctx, fmt.Sprintf("INSERT INTO river_job (%s) SELECT %s FROM river_job AS t "+
			"CROSS JOIN generate_series(1, %d) AS g ORDER BY g, t.ctid LIMIT %d",
			strings.Join(columns, ", "), strings.Join(sources, ", "), copies, missing))
		if err != nil {
			return nil, err
		}
	}
	rows, err := c.count(ctx)
	if err != nil {
		return nil, err
	}
	// ANALYZE the tables holding rows, as autovacuum would; leave empty ones alone.
	raw, err := c.sqlValue(ctx, "SELECT coalesce(json_agg(quote_ident(schemaname) || '.' || "+
		"quote_ident(relname)), '[]')::text FROM pg_stat_user_tables")
	if err != nil {
		return nil, err
	}
	var tables []string
	if err := json.Unmarshal([]byte(raw.(string)), &tables); err != nil {
		return nil, err
	}
	for _, table := range tables {
		var filled bool
		if err := c.pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM "+table+")").Scan(&filled); err != nil {
			return nil, err
		}
		if filled {
			if err := c.exec(ctx, "ANALYZE "+table); err != nil {
				return nil, err
			}
		}
	}
	if err := c.exec(ctx, "CHECKPOINT"); err != nil {
		return nil, err
	}
	return map[string]any{"seconds": time.Since(started).Seconds(), "rows": rows}, nil
}

func serveControl(ctx context.Context, opts options, out *emitter) error {
	pool, err := pgxpool.New(ctx, opts.dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	// An insert-only client: no Queues, no Workers, the same fetch settings as the worker.
	client, err := river.NewClient(riverpgxv5.New(pool), baseConfig(opts))
	if err != nil {
		return err
	}
	c := &control{pool: pool, client: client}
	scanner := bufio.NewScanner(os.Stdin)
	scanner.Buffer(make([]byte, 1<<20), 1<<20)
	for scanner.Scan() {
		var req map[string]any
		if err := json.Unmarshal(scanner.Bytes(), &req); err != nil {
			return err
		}
		reply, err := c.handle(ctx, req)
		if err != nil {
			reply = map[string]any{"ok": false, "error": err.Error()}
		} else {
			reply["ok"] = true
		}
		out.emit(reply)
	}
	return scanner.Err()
}

// --- worker role -----------------------------------------------------------------------------

func serveWorker(ctx context.Context, opts options, out *emitter) error {
	shutdown := make(chan struct{})
	var once sync.Once
	stop := func() { once.Do(func() { close(shutdown) }) }
	rec := &recorder{notifyAt: opts.notifyAt, stopAt: opts.stopAt, out: out, stop: stop}

	go func() {
		// A "stop" line, or EOF because the orchestrator went away: either way, stop.
		scanner := bufio.NewScanner(os.Stdin)
		for scanner.Scan() {
			if strings.TrimSpace(scanner.Text()) == "stop" {
				break
			}
		}
		stop()
	}()

	pool, err := pgxpool.New(ctx, opts.dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	workers := river.NewWorkers()
	for k := 0; k < opts.kinds; k++ {
		kinds[k].register(workers, rec)
	}
	config := baseConfig(opts)
	config.Queues = map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: opts.concurrency}}
	config.Workers = workers
	client, err := river.NewClient(riverpgxv5.New(pool), config)
	if err != nil {
		return err
	}
	out.emit(map[string]any{"event": "ready", "pid": os.Getpid(), "t": now()})
	if err := client.Start(ctx); err != nil {
		return err
	}
	<-shutdown
	// Graceful: running jobs finish and the completer flushes before Stop returns.
	if err := client.Stop(ctx); err != nil {
		return err
	}
	if err := rec.save(opts.timings); err != nil {
		return err
	}
	out.emit(map[string]any{"event": "stopped", "count": rec.count, "t": now()})
	return nil
}

// --- entry point -----------------------------------------------------------------------------

func versions() map[string]string {
	found := map[string]string{}
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, dep := range info.Deps {
			switch dep.Path {
			case "github.com/riverqueue/river":
				found["river"] = dep.Version
			case "github.com/jackc/pgx/v5":
				found["pgx"] = dep.Version
			}
		}
		found["go"] = info.GoVersion
	}
	return found
}

func parse(args []string) (string, options, error) {
	var opts options
	global := flag.NewFlagSet("river-adapter", flag.ContinueOnError)
	global.DurationVar(&opts.fetchCooldown, "fetch-cooldown", 0, "River FetchCooldown (0: its default)")
	global.DurationVar(&opts.fetchPollInterval, "fetch-poll-interval", 0, "River FetchPollInterval (0: its default)")
	if err := global.Parse(args); err != nil {
		return "", opts, err
	}
	if global.NArg() < 1 {
		return "", opts, errors.New("role (control or worker) missing")
	}
	role := global.Arg(0)
	local := flag.NewFlagSet(role, flag.ContinueOnError)
	local.StringVar(&opts.dsn, "dsn", "", "database URL")
	local.IntVar(&opts.concurrency, "concurrency", 1, "MaxWorkers of the default queue")
	local.IntVar(&opts.kinds, "kinds", 1, "job kinds to register")
	local.IntVar(&opts.notifyAt, "notify-at", 0, "emit 'reached' at this count")
	local.IntVar(&opts.stopAt, "stop-at", 0, "stop by itself at this count")
	local.StringVar(&opts.timings, "timings", "timings.bin", "where the (enqueued, started) pairs go")
	if err := local.Parse(global.Args()[1:]); err != nil {
		return "", opts, err
	}
	if opts.kinds > len(kinds) {
		return "", opts, fmt.Errorf("at most %d kinds", len(kinds))
	}
	return role, opts, nil
}

func main() {
	role, opts, err := parse(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	out := &emitter{out: os.Stdout}
	ctx := context.Background()
	switch role {
	case "control":
		err = serveControl(ctx, opts, out)
	case "worker":
		err = serveWorker(ctx, opts, out)
	default:
		err = fmt.Errorf("unknown role %q", role)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "river-adapter:", err)
		os.Exit(1)
	}
}
