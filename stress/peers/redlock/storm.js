#!/usr/bin/env node
// storm.js: node-redlock (npm redlock 4.2.0, ioredis 4.28.5) on N real
// redis-servers, the peer of dlock's Redlock mode. stress/redlock-peer runs
// it; README.md beside this file says what it measures and how.
//
// The parent forks P worker processes (node child processes); each runs T
// async workers sharing one Redlock instance (one ioredis client per node)
// and one store client. A worker loops: take a name with redlock.lock(name,
// lease), GET the name's counter from the store server, hold the critical
// section (spin or sleep cs_us), SET the value + 1, unlock, think. An
// increment is acknowledged once its SET returned; lost updates =
// acknowledged increments - the final counters: more than 0 only if two
// read-modify-writes of one name overlapped, that is if exclusion broke.
//
// The parent reads INFO cpu and INFO commandstats of every lock node at
// "go" and at "stop" (the window); acquisitions and waits count inside it,
// while increments and lost updates count to the end (every worker finishes
// its round before the counters are read).
//
// --pause-every-ms E --pause-ms D, the nemesis: every E ms the parent arms
// one worker process; the next of its workers to hold a lock stops the
// whole process with SIGSTOP right after its GET (a pause at the worst
// point, as a GC pause or a swapped-out process could), and the parent,
// seeing the process stopped (/proc/PID/stat), sends SIGCONT D ms later.
// With D longer than the lease, another worker takes the name meanwhile and
// the paused holder's SET lands on top of it: node-redlock hands out no
// fencing token the store could check.
//
// --no-lock, a planted mistake: no lock at all around the read-modify-write
// (the lost-update count must then be above 0).
//
// --semaphore L: a counting semaphore of limit L over the nodes instead
// (npm redis-semaphore 5.8.0, RedlockSemaphore: one per acquisition, with
// its defaults but lockTimeout = --lease-ms; acquire() polls every
// retryInterval, 10 ms, for up to acquireTimeout, 10 s). Inside a permit a
// worker INCRs the name's holder count on the store, holds the critical
// section, and DECRs it: a count above L is a holder over the limit
// (over_limit), as exclusion's lost updates are for a lock. No counter.
// --table: read the JSON lines of runs on stdin, print a Markdown table.
'use strict';

const { fork } = require('child_process');
const fs = require('fs');

function parseArgs(argv) {
  const o = {
    nodes: [], store: null, procs: 4, workers: 16, names: 1, csUs: 100,
    csSleep: false, thinkUs: 1000, leaseMs: 10000, seconds: 10,
    retryCount: 10, retryDelay: 200, retryJitter: 100, drift: 0.01,
    pauseEveryMs: 0, pauseMs: 0, noLock: false, table: false, child: false, semaphore: 0,
  };
  const num = (k, v) => {
    const x = Number(v);
    if (!Number.isFinite(x) || x < 0) throw new Error(`--${k}: not a number >= 0: ${v}`);
    return x;
  };
  const keys = {
    procs: 'procs', workers: 'workers', names: 'names', 'cs-us': 'csUs',
    'think-us': 'thinkUs', 'lease-ms': 'leaseMs', seconds: 'seconds',
    'retry-count': 'retryCount', 'retry-delay': 'retryDelay',
    'retry-jitter': 'retryJitter', drift: 'drift',
    'pause-every-ms': 'pauseEveryMs', 'pause-ms': 'pauseMs', semaphore: 'semaphore',
  };
  for (let i = 2; i < argv.length; i++) {
    const a = argv[i].replace(/^--/, '');
    if (a === 'cs-sleep') o.csSleep = true;
    else if (a === 'no-lock') o.noLock = true;
    else if (a === 'table') o.table = true;
    else if (a === 'child') o.child = true;
    else if (a === 'nodes') o.nodes = argv[++i].split(',').map(Number);
    else if (a === 'store') o.store = Number(argv[++i]);
    else if (keys[a]) o[keys[a]] = num(a, argv[++i]);
    else throw new Error(`unknown option ${argv[i]}`);
  }
  if (!o.table && (!o.nodes.length || !o.store)) throw new Error('--nodes PORT,PORT,... and --store PORT are needed');
  if (o.procs < 1 || o.workers < 1 || o.names < 1) throw new Error('--procs, --workers and --names are at least 1');
  return o;
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const nowUs = () => Number(process.hrtime.bigint() / 1000n);
const nameOf = (i) => `peer:hot:${i}`;
const counterOf = (i) => `peer:counter:${i}`;
const holdersOf = (i) => `peer:holders:${i}`;

// ---- a worker process ------------------------------------------------------

async function child(o) {
  const Redis = require('ioredis');
  const Redlock = require('redlock');
  const client = (port) => new Redis({ host: '127.0.0.1', port, enableOfflineQueue: true, maxRetriesPerRequest: 1 });
  const nodes = o.nodes.map(client);
  const store = client(o.store);
  const redlock = new Redlock(nodes, {
    driftFactor: o.drift, retryCount: o.retryCount, retryDelay: o.retryDelay, retryJitter: o.retryJitter,
  });
  redlock.on('clientError', () => { st.clientErrors++; });
  const st = { acquisitions: 0, waitsUs: [], lockErrors: 0, otherErrors: 0, unlockErrors: 0, clientErrors: 0, acked: 0, pauses: 0,
    maxHolders: 0, overLimit: 0 };
  const RedlockSemaphore = o.semaphore ? require('redis-semaphore').RedlockSemaphore : null;
  let running = false; let stopping = false; let armed = false;

  await Promise.all([...nodes, store].map((c) => c.ping()));
  process.on('disconnect', () => process.exit(1)); // the parent is gone
  process.on('message', (m) => {
    if (m.go) running = true;
    if (m.stop) { running = false; stopping = true; armed = false; }
    if (m.arm) armed = true;
  });
  process.send({ ready: true });
  while (!running && !stopping) await sleep(1);

  async function semWorker() {
    while (!stopping) {
      const n = Math.floor(Math.random() * o.names);
      const t0 = nowUs();
      const sem = new RedlockSemaphore(nodes, nameOf(n), o.semaphore, { lockTimeout: o.leaseMs });
      try {
        await sem.acquire();
      } catch (e) {
        if (/timeout|acquire/i.test(String(e && e.message))) st.lockErrors++; else st.otherErrors++;
        continue;
      }
      if (running) { st.acquisitions++; st.waitsUs.push(nowUs() - t0); }
      const h = await store.incr(holdersOf(n));
      if (h > st.maxHolders) st.maxHolders = h;
      if (h > o.semaphore) st.overLimit++;
      if (o.csSleep) await sleep(o.csUs / 1000);
      else { const end = nowUs() + o.csUs; while (nowUs() < end); }
      await store.decr(holdersOf(n));
      st.acked++;
      try { await sem.release(); } catch (e) { st.unlockErrors++; }
      if (o.thinkUs > 0) await sleep(o.thinkUs / 1000);
    }
  }

  async function worker() {
    if (o.semaphore) return semWorker();
    while (!stopping) {
      const n = Math.floor(Math.random() * o.names);
      const t0 = nowUs();
      let lock = null;
      if (!o.noLock) {
        try {
          lock = await redlock.lock(nameOf(n), o.leaseMs);
        } catch (e) {
          if (e instanceof Redlock.LockError) st.lockErrors++; else st.otherErrors++;
          continue;
        }
      }
      if (running) { st.acquisitions++; st.waitsUs.push(nowUs() - t0); }
      const v = Number(await store.get(counterOf(n)) || 0);
      if (armed && running) { armed = false; st.pauses++; process.kill(process.pid, 'SIGSTOP'); }
      if (o.csSleep) await sleep(o.csUs / 1000);
      else { const end = nowUs() + o.csUs; while (nowUs() < end); }
      await store.set(counterOf(n), v + 1);
      st.acked++;
      if (lock) { try { await lock.unlock(); } catch (e) { st.unlockErrors++; } }
      if (o.thinkUs > 0) await sleep(o.thinkUs / 1000);
    }
  }
  await Promise.all(Array.from({ length: o.workers }, worker));
  await Promise.all([...nodes, store].map((c) => c.quit()));
  process.send({ result: st }, () => process.exit(0));
}

// ---- the parent ------------------------------------------------------------

function parseInfo(text) {
  const r = { cpu: 0, cmds: {} };
  for (const line of text.split('\r\n')) {
    let m = /^used_cpu_(sys|user):([\d.]+)$/.exec(line);
    if (m) r.cpu += Number(m[2]);
    m = /^cmdstat_([^:]+):calls=(\d+)/.exec(line);
    if (m) r.cmds[m[1]] = Number(m[2]);
  }
  return r;
}

async function snapshot(clients) {
  const all = { cpu: 0, cmds: {} };
  for (const c of clients) {
    const r = parseInfo(await c.info('cpu') + '\r\n' + await c.info('commandstats'));
    all.cpu += r.cpu;
    for (const [k, v] of Object.entries(r.cmds)) all.cmds[k] = (all.cmds[k] || 0) + v;
  }
  return all;
}

function quantile(sorted, q) {
  if (!sorted.length) return null;
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))];
}

function procState(pid) {
  try { return fs.readFileSync(`/proc/${pid}/stat`, 'utf8').replace(/^.*\) /s, '')[0]; } catch (e) { return '?'; }
}

async function parent(o) {
  const Redis = require('ioredis');
  const nodes = o.nodes.map((port) => new Redis({ host: '127.0.0.1', port }));
  const store = new Redis({ host: '127.0.0.1', port: o.store });
  await store.del(...Array.from({ length: o.names }, (_, i) => counterOf(i)),
    ...Array.from({ length: o.names }, (_, i) => holdersOf(i)));
  for (const c of nodes) await c.del(...Array.from({ length: o.names }, (_, i) => nameOf(i)));

  const kids = [];
  const results = [];
  const args = process.argv.slice(2).concat(['--child']);
  let ready = 0;
  let done;
  const allDone = new Promise((r) => { done = r; });
  let readyAll;
  const allReady = new Promise((r) => { readyAll = r; });
  for (let i = 0; i < o.procs; i++) {
    const k = fork(__filename, args, { stdio: ['ignore', 'inherit', 'inherit', 'ipc'] });
    k.on('message', (m) => {
      if (m.ready && ++ready === o.procs) readyAll();
      if (m.result) { results.push(m.result); if (results.length === o.procs) done(); }
    });
    k.on('exit', (code, sig) => {
      if (code === 0) return;
      console.error(`storm.js: worker process ${k.pid} exited with ${code === null ? sig : code}`);
      for (const o2 of kids) { try { o2.kill('SIGCONT'); o2.kill('SIGKILL'); } catch (e) { /* gone */ } }
      process.exit(2);
    });
    kids.push(k);
  }
  // Every run is bounded: the worker processes are killed past this.
  const hard = setTimeout(() => {
    console.error('storm.js: the worker processes did not finish in time; killed');
    for (const k of kids) { try { k.kill('SIGCONT'); k.kill('SIGKILL'); } catch (e) { /* gone */ } }
    process.exit(3);
  }, (o.seconds + 60) * 1000 + o.pauseMs);

  await allReady;
  const before = await snapshot(nodes);
  const t0 = Date.now();
  for (const k of kids) k.send({ go: true });

  let pauses = 0; let pausedMs = 0;
  let nemesis = null;
  if (o.pauseEveryMs > 0) {
    nemesis = (async () => {
      while (Date.now() - t0 + o.pauseEveryMs < o.seconds * 1000) {
        await sleep(o.pauseEveryMs);
        const k = kids[Math.floor(Math.random() * kids.length)];
        k.send({ arm: true });
        // Until it stops itself (in its next critical section) or the run ends.
        while (procState(k.pid) !== 'T' && Date.now() - t0 < o.seconds * 1000) await sleep(2);
        if (procState(k.pid) !== 'T') break;
        const stoppedAt = Date.now();
        await sleep(o.pauseMs);
        k.kill('SIGCONT');
        pauses++; pausedMs += Date.now() - stoppedAt;
      }
    })();
  }
  await sleep(o.seconds * 1000);
  const after = await snapshot(nodes);
  const elapsed = (Date.now() - t0) / 1000;
  if (nemesis) await nemesis;
  for (const k of kids) k.send({ stop: true });
  // An armed process may stop itself before it reads "stop": keep it going.
  const cont = setInterval(() => { for (const k of kids) { try { k.kill('SIGCONT'); } catch (e) { /* gone */ } } }, 50);
  await allDone;
  clearInterval(cont);
  clearTimeout(hard);

  const sum = (k) => results.reduce((a, r) => a + r[k], 0);
  let final = 0;
  for (let i = 0; i < o.names; i++) final += Number(await store.get(counterOf(i)) || 0);
  if (o.semaphore) final = sum('acked'); // (no counter: the holders' count says it)
  await Promise.all([...nodes, store].map((c) => c.quit()));
  const waits = [].concat(...results.map((r) => r.waitsUs)).sort((a, b) => a - b);
  const cmds = {};
  let ncmds = 0; let trips = 0;
  for (const [k, v] of Object.entries(after.cmds)) {
    if (k === 'info') continue; // the parent's own snapshots
    const d = v - (before.cmds[k] || 0);
    if (d > 0) { cmds[k] = d; ncmds += d; }
    // node-redlock sends the nodes nothing but its scripts: the round trips;
    // commandstats counts the commands the scripts call too (ncmds).
    if (d > 0 && (k === 'eval' || k === 'evalsha')) trips += d;
  }
  const acq = sum('acquisitions');
  const cpu = after.cpu - before.cpu;
  const ms = (us) => (us === null ? null : +(us / 1000).toFixed(2));
  const out = {
    client: o.semaphore ? 'redis-semaphore 5.8.0 RedlockSemaphore' : 'node-redlock 4.2.0',
    sem_limit: o.semaphore || null, nodes: o.nodes.length, procs: o.procs, workers: o.workers,
    names: o.names, cs_us: o.csUs, cs: o.csSleep ? 'sleep' : 'spin', think_us: o.thinkUs,
    lease_ms: o.leaseMs, seconds: +elapsed.toFixed(2), no_lock: o.noLock,
    retry: o.semaphore ? { lockTimeout: o.leaseMs, acquireTimeout: 10000, retryInterval: 10 }
      : { retryCount: o.retryCount, retryDelay: o.retryDelay, retryJitter: o.retryJitter, driftFactor: o.drift },
    acquisitions: acq, acq_per_s: +(acq / elapsed).toFixed(1),
    wait_p50_ms: ms(quantile(waits, 0.5)), wait_p99_ms: ms(quantile(waits, 0.99)), wait_max_ms: ms(quantile(waits, 1)),
    lock_errors: sum('lockErrors'), other_errors: sum('otherErrors'), unlock_errors: sum('unlockErrors'),
    client_errors: sum('clientErrors'),
    redis_cmds: cmds, redis_round_trips_per_acq: acq ? +(trips / acq).toFixed(2) : null,
    redis_cmds_per_acq: acq ? +(ncmds / acq).toFixed(2) : null,
    redis_cpu_s: +cpu.toFixed(3), redis_cpu_us_per_acq: acq ? +(cpu * 1e6 / acq).toFixed(1) : null,
    pause_every_ms: o.pauseEveryMs, pause_ms: o.pauseMs, pauses, paused_ms: pausedMs,
    acked: sum('acked'), final, lost_updates: sum('acked') - final,
    max_holders: o.semaphore ? Math.max(...results.map((r) => r.maxHolders)) : null,
    over_limit: o.semaphore ? sum('overLimit') : null,
  };
  console.log(JSON.stringify(out));
}

// ---- --table ---------------------------------------------------------------

function table() {
  const runs = fs.readFileSync(0, 'utf8').split('\n').filter((l) => l.trim()).map((l) => JSON.parse(l));
  const cols = [
    ['nodes', 'nodes'], ['acq/s', 'acq_per_s'], ['wait p50 ms', 'wait_p50_ms'], ['wait p99 ms', 'wait_p99_ms'],
    ['wait max ms', 'wait_max_ms'], ['Redis round trips/acq', 'redis_round_trips_per_acq'],
    ['Redis cmds/acq', 'redis_cmds_per_acq'], ['Redis CPU us/acq', 'redis_cpu_us_per_acq'],
    ['lock errors', 'lock_errors'], ['pauses', 'pauses'], ['acked', 'acked'], ['lost updates', 'lost_updates'],
  ];
  const median = (xs) => { const s = xs.filter((x) => x !== null).sort((a, b) => a - b); return s.length ? s[(s.length - 1) >> 1] : null; };
  if (runs.some((r) => r.sem_limit)) cols.push(['max holders', 'max_holders'], ['over limit', 'over_limit']);
  const rows = runs.map((r, i) => [`${i + 1}`].concat(cols.map(([, k]) => r[k])));
  if (runs.length > 1) rows.push(['**median**'].concat(cols.map(([, k]) => median(runs.map((r) => r[k])))));
  console.log(`| run | ${cols.map(([h]) => h).join(' | ')} |`);
  console.log(`|---|${cols.map(() => '---:').join('|')}|`);
  for (const r of rows) console.log(`| ${r.map((x) => (x === null ? '-' : x)).join(' | ')} |`);
}

const opts = parseArgs(process.argv);
const main = opts.table ? async () => table() : opts.child ? child : parent;
main(opts).catch((e) => { console.error(`storm.js: ${e.stack || e}`); process.exit(2); });
