// One keuss process of `bucketq bench keuss`: a producer or a consumer of keuss's
// bucket-mongo-safe queue (keuss installed from npm into a cache directory, never
// vendored). Started by bucketq/benchmark/keuss/__init__.py:
//
//   node driver.js produce|consume KEUSS_DIR URI QUEUE N
//
// It opens its queue, prints {"ready": true}, waits for a line "go" on stdin, runs its
// phase and prints one JSON line: wall seconds, process CPU seconds, the commands its
// MongoDB client sent in the phase, by name (the driver's command monitoring), and the
// checksum (count, sum, sum of squares) of the item numbers it pushed or committed.
//  - produce: pushes items 0 .. N-1 (the same ~100-byte payloads as bucketq's
//    benchmark) with up to PUSH_WINDOW pushes unanswered (keuss answers a push at once
//    unless it seals a bucket, whose insert it waits for), then drain() inserts the last,
//    partial bucket: every item is stored when it reports;
//  - consume: pop({reserve: true}) then ok() per item, one after the other (16 chains
//    at once went no faster, and their drain() raced keuss's own state flush), until N
//    are committed; then it waits for keuss's periodic state flush (state_flush_period)
//    to write the commits and delete the finished buckets, asking totalSize() every
//    POLL_MS: the queue is empty when it reports.
'use strict';

const path = require('path');
const readline = require('readline');

const [mode, keussDir, uri, queueName, nArg] = process.argv.slice(2);
const N = parseInt(nArg, 10);
const PUSH_WINDOW = 4096;
const POLL_MS = 10;

function need(mod) {
  return require(require.resolve(mod, { paths: [keussDir] }));
}

function fail(what, err) {
  process.stderr.write(`keuss ${mode}: ${what}: ${err && (err.stack || JSON.stringify(err))}\n`);
  process.exit(1);
}

function payload(i) {
  return {
    i: i,
    svc: 'checkout',
    level: 'info',
    msg: `order ${String(i).padStart(8, '0')} paid`,
    user: `u${String(i % 997).padStart(4, '0')}`,
  };
}

const sums = { count: 0, total: 0, squares: 0n };
function tally(i) {
  sums.count += 1;
  sums.total += i;
  sums.squares += BigInt(i) * BigInt(i);
}

// Commands sent by the queue's MongoDB client, by name, counted from "go" on.
let commands = {};
function countCommands(client) {
  if (!client || typeof client.on !== 'function') return false;
  client.on('commandStarted', (e) => {
    commands[e.commandName] = (commands[e.commandName] || 0) + 1;
  });
  return true;
}
let counting = false;

function report(t0, cpu0, extra) {
  const wall = Number(process.hrtime.bigint() - t0) / 1e9;
  const cpu = process.cpuUsage(cpu0);
  const out = {
    wall_s: wall,
    cpu_s: (cpu.user + cpu.system) / 1e6,
    commands: counting ? commands : null,
    checksum: [sums.count, sums.total, sums.squares.toString()],
    ...extra,
  };
  process.stdout.write(JSON.stringify(out) + '\n');
}

function produce(q, done) {
  const t0 = process.hrtime.bigint();
  const cpu0 = process.cpuUsage();
  let next = 0;
  let pending = 0;
  let drained = false;
  const finish = () => {
    if (pending || !drained) return;
    report(t0, cpu0, {});
    done();
  };
  const pump = () => {
    while (next < N && pending < PUSH_WINDOW) {
      const i = next++;
      pending++;
      q.push(payload(i), (err) => {
        if (err) fail('push', err);
        tally(i);
        pending--;
        if (next < N) {
          if (pending === PUSH_WINDOW - 1024) setImmediate(pump);
        } else if (!pending) {
          q.drain((err) => {
            if (err) fail('drain', err);
            drained = true;
            finish();
          });
        }
      });
    }
  };
  pump();
}

function consume(q, done) {
  const t0 = process.hrtime.bigint();
  const cpu0 = process.cpuUsage();
  let committed = 0;
  const empty = () => {
    q.totalSize((err, size) => {
      if (err) fail('totalSize', err);
      if (size) return setTimeout(empty, POLL_MS);
      report(t0, cpu0, {});
      done();
    });
  };
  const chain = () => {
    q.pop('bench', { reserve: true }, (err, item) => {
      if (err) fail('pop', err);
      q.ok(item, (err, ok) => {
        if (err || !ok) fail('ok', err || 'the commit was refused');
        tally(item.payload.i);
        committed++;
        if (committed < N) chain();
        else empty();
      });
    });
  };
  chain();
}

const MQ = need('keuss/backends/bucket-mongo-safe');
const factoryOpts = {
  // monitorCommands: the client emits commandStarted, counted per phase (see report).
  url: uri + (uri.includes('?') ? '&' : '?') + 'monitorCommands=true',
  // keuss's defaults would add a stats collection and a capped-collection signaller on
  // the same server; in-memory stats and local signals leave only the queue's own work.
  stats: { provider: need('keuss/stats/mem') },
  signaller: { provider: need('keuss/signal/local') },
};

MQ(factoryOpts, (err, factory) => {
  if (err) fail('connect', err);
  // keuss keeps its MongoClient in the factory (keuss 2.0.6: _mongo_conn); without it the
  // phase reports no commands (null) rather than failing.
  counting = countCommands(factory._mongo_conn);
  // keuss's defaults, written out: 1,024 items a bucket, 30 s reserve, 500 ms state flush.
  const opts = { bucket_max_size: 1024, bucket_max_wait: 500, reserve_delay: 30, state_flush_period: 500 };
  factory.queue(queueName, opts, (err, q) => {
    if (err) fail('queue', err);
    const rl = readline.createInterface({ input: process.stdin });
    let finished = false;
    // The parent closes stdin to stop this process (its run failed or was interrupted).
    rl.on('close', () => {
      if (!finished) process.exit(1);
    });
    rl.once('line', (line) => {
      if (line.trim() !== 'go') fail('stdin', `expected "go", got ${JSON.stringify(line)}`);
      commands = {}; // what opening the queue sent is setup, not the phase
      const done = () => {
        finished = true;
        rl.close();
        factory.close(() => process.exit(0));
      };
      if (mode === 'produce') produce(q, done);
      else if (mode === 'consume') consume(q, done);
      else fail('usage', `unknown mode ${mode}`);
    });
    process.stdout.write(JSON.stringify({ ready: true }) + '\n');
  });
});
