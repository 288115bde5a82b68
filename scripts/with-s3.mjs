// Run a command with a throwaway S3-compatible server for the tests, and exit with its exit code.
//
//   node scripts/with-s3.mjs <command...>     (the command runs through the shell)
//
// With LITTLE_TEST_S3_ENDPOINT already set, that server is used and nothing is started.
// Otherwise moto's server (`moto_server`, from `pip install "moto[server]==5.2.6"`) is looked up
// on PATH (LITTLE_TEST_MOTO_SERVER names the executable instead, and one that is not there, such
// as /nonexistent, tests the path without it). It is started on the first free port from 54430
// on, on 127.0.0.1 only, with its log in a temporary directory. moto keeps every bucket in the
// memory of its process and checks no signature: each test makes a bucket of its own. The command
// gets:
//
//   LITTLE_TEST_S3_ENDPOINT   http://127.0.0.1:<port>
//   LITTLE_TEST_S3_CTL        JSON {"pidFile", "command", "port", "log"}: the file holding the pid
//                             of the running server (its process group's too), the command line
//                             that starts it on that port, and its log, so a test can stop the
//                             server (kill the pid in the file) and start it again on the same port
//                             (run the command detached, output to the log, and write its pid to
//                             the file, which is how this script finds the server to stop at the
//                             end). A restarted server has lost every bucket and object.
//   AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION
//                             little-test, little-test-secret and us-east-1, each unless already
//                             set: the credentials an S3 client looks for, which moto accepts.
//
// The server is stopped and its directory removed when the command ends, fails, or this script is
// interrupted (SIGINT, SIGTERM, SIGHUP). Without moto_server this prints a `SKIPPED:` line and runs
// the command without a server, except under CI=true, where it exits 1 without running it.
import { spawn } from 'node:child_process';
import { closeSync, mkdtempSync, openSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { isAbsolute, join } from 'node:path';
import { claim, commandOf, commandRunner, isExecutable, logTail, release } from './wrapper.mjs';

const FIRST_PORT = 54430;
const PORTS_TRIED = 100;
const START_TIMEOUT_S = 30;
const HOST = '127.0.0.1';
const HOW_TO_ENABLE = 'install moto\'s server (pip install "moto[server]==5.2.6"), or set LITTLE_TEST_S3_ENDPOINT to an S3-compatible server the tests may use';
const CREDENTIALS = { AWS_ACCESS_KEY_ID: 'little-test', AWS_SECRET_ACCESS_KEY: 'little-test-secret', AWS_REGION: 'us-east-1' };

const say = (line) => process.stderr.write(`with-s3: ${line}\n`);

const command = commandOf('with-s3', say);

/** The moto_server executable, or null. */
function findServer() {
  const forced = process.env.LITTLE_TEST_MOTO_SERVER;
  if (forced) return isExecutable(forced) ? forced : null;
  for (const dir of (process.env.PATH ?? '').split(':')) {
    if (dir && isAbsolute(dir) && isExecutable(join(dir, 'moto_server'))) return join(dir, 'moto_server');
  }
  return null;
}

// Signals to this script are passed on to the command (see scripts/wrapper.mjs).
const runCommand = commandRunner(command, say);

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** Whether nothing listens on `port` of 127.0.0.1 yet (by binding it for a moment). */
function portIsFree(port) {
  return new Promise((resolve) => {
    const probe = createServer();
    probe.once('error', () => resolve(false));
    probe.listen(port, HOST, () => probe.close(() => resolve(true)));
  });
}

/** Whether an HTTP server answers at `url` (any status: moto answers `GET /` with 200). */
async function answers(url) {
  try {
    const res = await fetch(url, { signal: AbortSignal.timeout(2_000) });
    await res.arrayBuffer();
    return true;
  } catch {
    return false;
  }
}

/** A throwaway moto server, with everything needed to stop it and remove it. */
class Server {
  constructor(exe) {
    this.exe = exe;
    this.dir = null;
    this.claim = null;
    this.port = null;
    this.pid = null;
  }

  get pidFile() {
    return join(this.dir, 'server.pid');
  }

  get log() {
    return join(this.dir, 'server.log');
  }

  get args() {
    return ['-H', HOST, '-p', String(this.port)];
  }

  get endpoint() {
    return `http://${HOST}:${this.port}`;
  }

  /** Start the server on a free port and wait until it answers; throws with what went wrong. */
  async start() {
    this.dir = mkdtempSync(join(tmpdir(), 'little-s3-'));
    for (let port = FIRST_PORT; port < FIRST_PORT + PORTS_TRIED; port++) {
      if (!this.claimPort(port)) continue;
      if (await portIsFree(port)) {
        this.port = port;
        if (await this.launch()) return;
        // Another program took the port between the probe and the start: try the next one.
        if (!/address already in use/i.test(this.logText())) throw new Error(`moto_server exited at its start\n${this.logTail()}`);
        this.stopServer();
      }
      this.releaseClaim();
    }
    throw new Error(`no free port from ${FIRST_PORT} to ${FIRST_PORT + PORTS_TRIED - 1}`);
  }

  /** Start moto_server on `this.port`: true once it answers, false when it exited first. */
  async launch() {
    writeFileSync(this.log, '');
    const out = openSync(this.log, 'a');
    // Its own process group, so that a Ctrl-C meant for the command does not stop it under the
    // command's feet, and so that stopping the group stops all of it.
    const child = spawn(this.exe, this.args, { detached: true, stdio: ['ignore', out, out] });
    closeSync(out);
    let exited = false;
    child.once('exit', () => (exited = true));
    child.once('error', () => (exited = true));
    child.unref();
    if (child.pid === undefined) return false;
    this.pid = child.pid;
    writeFileSync(this.pidFile, String(child.pid));
    const deadline = Date.now() + START_TIMEOUT_S * 1000;
    for (;;) {
      if (exited) return false;
      if (await answers(`${this.endpoint}/`)) return true;
      if (Date.now() > deadline) throw new Error(`moto_server does not answer at ${this.endpoint} after ${START_TIMEOUT_S} s\n${this.logTail()}`);
      await sleep(100);
    }
  }

  /**
   * Claim a port number no other run of this script is using, by a file holding our pid, so that
   * two runs at once do not race for one port between the probe and the start.
   */
  claimPort(port) {
    const file = join(tmpdir(), `little-s3-${port}.claim`);
    if (!claim(file)) return false;
    this.claim = file;
    return true;
  }

  releaseClaim() {
    if (this.claim) release(this.claim);
    this.claim = null;
  }

  logText() {
    try {
      return readFileSync(this.log, 'utf8');
    } catch {
      return '';
    }
  }

  logTail() {
    return logTail(this.log);
  }

  env() {
    return {
      LITTLE_TEST_S3_ENDPOINT: this.endpoint,
      LITTLE_TEST_S3_CTL: JSON.stringify({ pidFile: this.pidFile, command: [this.exe, ...this.args], port: this.port, log: this.log }),
    };
  }

  /**
   * Kill the server this script started and the one a test may have started in its place (whose
   * pid is in the pid file), with their process groups. moto keeps nothing worth a clean shutdown.
   */
  stopServer() {
    const pids = new Set([this.pid]);
    try {
      pids.add(Number(readFileSync(this.pidFile, 'utf8')));
    } catch {
      // no pid file
    }
    for (const pid of pids) {
      if (!Number.isInteger(pid) || pid <= 0) continue;
      for (const target of [-pid, pid]) {
        try {
          process.kill(target, 'SIGKILL');
        } catch {
          // not running
        }
      }
    }
    this.pid = null;
  }

  /** Stop the server if it runs, remove its directory and release the port. Safe to call twice. */
  cleanup() {
    if (this.dir) this.stopServer();
    if (this.dir) rmSync(this.dir, { recursive: true, force: true });
    this.dir = null;
    this.releaseClaim();
  }
}

async function main() {
  const credentials = Object.fromEntries(Object.entries(CREDENTIALS).filter(([k]) => !process.env[k]));
  if (process.env.LITTLE_TEST_S3_ENDPOINT) {
    say('using the server at LITTLE_TEST_S3_ENDPOINT');
    return runCommand({ ...process.env, ...credentials });
  }
  const exe = findServer();
  if (!exe) {
    if (process.env.CI === 'true') {
      say(`error: an S3-compatible server is required under CI=true, and moto_server was not found: ${HOW_TO_ENABLE}`);
      return 1;
    }
    console.warn(`SKIPPED: the S3 artifact tests, since moto_server was not found: ${HOW_TO_ENABLE}`);
    return runCommand(process.env);
  }

  const server = new Server(exe);
  // A last resort, for when this script dies of an error of its own.
  process.on('exit', () => server.cleanup());
  try {
    await server.start();
  } catch (e) {
    say(`could not start moto_server (${exe}): ${e.message}`);
    server.cleanup();
    return 1;
  }
  say(`moto_server at ${server.endpoint} (log in ${server.log})`);
  // Give a signal that came during the start a moment to be handled before the command runs.
  await sleep(50);
  const code = await runCommand({ ...process.env, ...credentials, ...server.env() });
  server.cleanup();
  return code;
}

process.exit(await main());
