// test/counting-pool.mjs: what the test files share. countingPool(log, base)
// is a pool that records the SQL and parameters of every query (on its
// clients and its own) in log, and runs them on base.
export function countingPool(log, base) {
  const wrapClient = (c) => new Proxy(c, {
    get(t, p) {
      if (p === 'query') return (sql, params) => { log.push({ sql, params }); return t.query(sql, params); };
      const v = t[p];
      return typeof v === 'function' ? v.bind(t) : v;
    },
  });
  return {
    connect: async () => wrapClient(await base.connect()),
    query: (sql, params) => { log.push({ sql, params }); return base.query(sql, params); },
  };
}
