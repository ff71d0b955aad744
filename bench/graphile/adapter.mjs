// The graphile-worker adapter: the harness's adapter protocol (bench/adapters/base.py) for
// graphile-worker, the Node job queue, through its public API only.
//
//   node adapter.mjs {control|worker} --dsn DSN [--concurrency C] [--kinds K] ...
//
// Same roles, commands, events and timings file as the Python adapters: "control" reads one
// JSON command per line on stdin and answers one JSON line on stdout; "worker" runs
// graphile-worker's runner, whose no-op tasks record (enqueued_at, started_at) in memory,
// writes "ready"/"reached"/"stopped" events and stops on a "stop" line or EOF. Timestamps are
// wall-clock seconds, as Python's time.time().
//
// Set-up, as graphile-worker's docs show it: the schema from `migrate()` (what the worker runs
// on start), jobs added with `addJob` (one) or `addJobs` (a batch, one statement), the runner
// from `run({ concurrency, taskList })` with every other option at its default (LISTEN/NOTIFY,
// pollInterval 2 s, no local queue, no batched completion), except maxPoolSize, raised to the
// concurrency when that is above its default of 10, as the runner's own warning asks.
import fs from "node:fs";
import readline from "node:readline";
import { performance } from "node:perf_hooks";
import { run, makeWorkerUtils, Logger } from "graphile-worker";
import pg from "pg";
import { wallClock } from "./clock.mjs";

const PRELOAD_BATCH = 1000;
const JOBS = "graphile_worker._private_jobs";

const now = wallClock();

// The protocol owns the real stdout; anything a library prints goes to stderr (the log).
const emit = (value) => fs.writeSync(1, JSON.stringify(value) + "\n");
console.log = console.error;
console.info = console.error;

const logger = new Logger(() => (level, message) => {
  if (level === "error" || level === "warning") {
    process.stderr.write(`${level}: ${message}\n`);
  }
});

const kindName = (index) => `noop${index}`;

function parseArgs(argv) {
  const [role, ...rest] = argv;
  const opts = { role, dsn: "", concurrency: 1, kinds: 1, notifyAt: 0, stopAt: 0, timings: "timings.bin" };
  const names = {
    "--dsn": "dsn",
    "--concurrency": "concurrency",
    "--kinds": "kinds",
    "--notify-at": "notifyAt",
    "--stop-at": "stopAt",
    "--timings": "timings",
  };
  for (let i = 0; i < rest.length; i += 2) {
    const key = names[rest[i]];
    if (!key) throw new Error(`unknown option ${rest[i]}`);
    opts[key] = typeof opts[key] === "number" ? Number(rest[i + 1]) : rest[i + 1];
  }
  return opts;
}

// --- control role ---------------------------------------------------------------------------

async function serveControl(opts) {
  const utils = await makeWorkerUtils({ connectionString: opts.dsn, logger });
  // The harness's own SQL (drain detection, preload) on a side connection.
  const sql = new pg.Client({ connectionString: opts.dsn });
  await sql.connect();
  const value = async (query) => {
    const result = await sql.query({ text: query, rowMode: "array" });
    return result.rows.length ? result.rows[0][0] : null;
  };
  const addMany = (kind, count, enqueuedAt) => {
    const specs = [];
    for (let i = 0; i < count; i++) {
      specs.push({ identifier: kindName(kind), payload: { enqueued_at: enqueuedAt } });
    }
    return utils.addJobs(specs);
  };

  const commands = {
    info: async () => ({ versions: versions() }),
    install: async () => {
      await utils.migrate();
      return {};
    },
    enqueue: async ({ mode, n, batch }) => {
      const started = performance.now();
      if (mode === "sequential") {
        for (let i = 0; i < n; i++) {
          await utils.addJob(kindName(0), { enqueued_at: now() });
        }
      } else if (mode === "bulk") {
        for (let offset = 0; offset < n; offset += batch) {
          await addMany(0, Math.min(batch, n - offset), now());
        }
      } else {
        throw new Error(`unknown enqueue mode ${mode}`);
      }
      return { seconds: (performance.now() - started) / 1000, jobs: n };
    },
    pace: async ({ rate, seconds }) => {
      // One job every 1/rate s against an absolute schedule (no coordinated omission).
      const total = Math.round(rate * seconds);
      const start = now() + 0.05;
      let maxLag = 0;
      for (let i = 0; i < total; i++) {
        const delay = start + i / rate - now();
        if (delay > 0) {
          await new Promise((resolve) => setTimeout(resolve, delay * 1000));
        } else {
          maxLag = Math.max(maxLag, -delay);
        }
        await utils.addJob(kindName(0), { enqueued_at: now() });
      }
      return { jobs: total, max_lag_ms: maxLag * 1000 };
    },
    preload: async ({ total, kinds, template_per_kind }) => {
      // As Control.cmd_preload in bench/adapters/base.py: the API writes a template, one
      // INSERT ... SELECT clones it, filled tables are analysed, CHECKPOINT.
      const started = performance.now();
      const perKind = Math.max(1, Math.min(template_per_kind, Math.floor(total / kinds)));
      for (let kind = 0; kind < kinds; kind++) {
        for (let offset = 0; offset < perKind; offset += PRELOAD_BATCH) {
          await addMany(kind, Math.min(PRELOAD_BATCH, perKind - offset), now());
        }
      }
      const have = Number(await value(`SELECT count(*) FROM ${JOBS}`));
      const missing = total - have;
      if (missing > 0) {
        const columns = JSON.parse(
          await value(
            "SELECT coalesce(json_agg(column_name ORDER BY ordinal_position), '[]')::text " +
              "FROM information_schema.columns WHERE table_schema = 'graphile_worker' " +
              "AND table_name = '_private_jobs' AND is_identity = 'NO' AND is_generated = 'NEVER' " +
              "AND left(coalesce(column_default, ''), 8) <> 'nextval('",
          ),
        );
        const copies = Math.ceil(missing / have);
        await sql.query(
          `INSERT INTO ${JOBS} (${columns.join(", ")}) ` +
            `SELECT ${columns.map((c) => `t.${c}`).join(", ")} FROM ${JOBS} AS t ` +
            `CROSS JOIN generate_series(1, ${copies}) AS g ORDER BY g, t.ctid LIMIT ${missing}`,
        );
      }
      const rows = Number(await value(`SELECT count(*) FROM ${JOBS}`));
      const tables = JSON.parse(
        await value(
          "SELECT coalesce(json_agg(quote_ident(schemaname) || '.' || quote_ident(relname)), " +
            "'[]')::text FROM pg_stat_user_tables",
        ),
      );
      for (const table of tables) {
        if (await value(`SELECT EXISTS (SELECT 1 FROM ${table})`)) {
          await sql.query(`ANALYZE ${table}`);
        }
      }
      await sql.query("CHECKPOINT");
      return { seconds: (performance.now() - started) / 1000, rows };
    },
    checkpoint: async () => {
      await sql.query("CHECKPOINT");
      return {};
    },
    wait_drained: async ({ limit_s, poll_s }) => {
      // Completed jobs are deleted, so "outstanding" is any row left.
      const deadline = performance.now() + limit_s * 1000;
      let polls = 0;
      while (await value(`SELECT EXISTS (SELECT 1 FROM ${JOBS})`)) {
        polls++;
        if (performance.now() > deadline) {
          throw new Error(`jobs still outstanding after ${limit_s}s`);
        }
        await new Promise((resolve) => setTimeout(resolve, poll_s * 1000));
      }
      return { t_done: now(), polls };
    },
    stats: async () => ({
      unsupported:
        "graphile-worker has no queue-statistics call (its jobs view is read with SQL)",
    }),
  };

  const lines = readline.createInterface({ input: process.stdin });
  try {
    for await (const line of lines) {
      const { cmd, ...params } = JSON.parse(line);
      let reply;
      try {
        if (!commands[cmd]) throw new Error(`unknown command ${cmd}`);
        reply = { ...(await commands[cmd](params)), ok: true };
      } catch (error) {
        reply = { ok: false, error: `${error.name}: ${error.message}` };
      }
      emit(reply);
    }
  } finally {
    await sql.end();
    await utils.release();
  }
}

// --- worker role ----------------------------------------------------------------------------

async function serveWorker(opts) {
  let pairs = new Float64Array(2 * Math.max(1024, opts.notifyAt, opts.stopAt));
  let count = 0;
  let stopRequested;
  const stopped = new Promise((resolve) => (stopRequested = resolve));

  const record = (enqueuedAt) => {
    const startedAt = now();
    if (2 * count + 2 > pairs.length) {
      const grown = new Float64Array(pairs.length * 2);
      grown.set(pairs);
      pairs = grown;
    }
    pairs[2 * count] = enqueuedAt;
    pairs[2 * count + 1] = startedAt;
    count++;
    if (count === opts.notifyAt) emit({ event: "reached", count, t: now() });
    if (count === opts.stopAt) stopRequested();
  };

  // A "stop" line, or EOF because the orchestrator went away: either way, stop.
  const lines = readline.createInterface({ input: process.stdin });
  lines.on("line", (line) => {
    if (line.trim() === "stop") stopRequested();
  });
  lines.on("close", () => stopRequested());

  const taskList = {};
  for (let kind = 0; kind < opts.kinds; kind++) {
    taskList[kindName(kind)] = async (payload) => {
      record(payload.enqueued_at);
    };
  }
  const runner = await run({
    connectionString: opts.dsn,
    concurrency: opts.concurrency,
    maxPoolSize: Math.max(10, opts.concurrency),
    noHandleSignals: true,
    taskList,
    logger,
  });
  emit({ event: "ready", pid: process.pid, t: now() });
  await stopped;
  await runner.stop(); // graceful: running jobs finish first
  fs.writeFileSync(opts.timings, Buffer.from(pairs.buffer, 0, 16 * count));
  emit({ event: "stopped", count, t: now() });
  lines.close();
}

function versions() {
  const read = (name) =>
    JSON.parse(fs.readFileSync(new URL(`./node_modules/${name}/package.json`, import.meta.url)))
      .version;
  return { "graphile-worker": read("graphile-worker"), pg: read("pg"), node: process.versions.node };
}

const opts = parseArgs(process.argv.slice(2));
const serve = { control: serveControl, worker: serveWorker }[opts.role];
if (!serve) {
  process.stderr.write(`unknown role ${opts.role}\n`);
  process.exit(2);
}
serve(opts).then(
  () => process.exit(0),
  (error) => {
    process.stderr.write(`graphile adapter: ${error.stack}\n`);
    process.exit(1);
  },
);
