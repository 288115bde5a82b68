// Promise.withResolvers (Node 22) for the Workflow SDK's conformance suite and the servers it
// spawns, on Node 20. Loaded with --require through NODE_OPTIONS.
if (typeof Promise.withResolvers !== 'function') {
  Promise.withResolvers = function withResolvers() {
    let resolve;
    let reject;
    const promise = new this((res, rej) => {
      resolve = res;
      reject = rej;
    });
    return { promise, resolve, reject };
  };
}
