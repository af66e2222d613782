import csv,statistics as st,sys
from collections import defaultdict
rows=list(csv.DictReader(open(sys.argv[1]+'/results.tsv'),delimiter='\t'))
d=defaultdict(dict)
for r in rows:
    if r['phase']!='parts': continue
    d[(r['group'],r['path'],r['round'])][r['target']]=r
def cpu(r):
    ops=float(r['ops']); return 1e6*sum(float(r[k] or 0) for k in ('cpu_single_s','cpu_coord_s','cpu_w1_s','cpu_w2_s'))/ops
for g,a,b,kind in (('sql','coordfn','coord','tps'),('pk','coordfn','coord','tps'),('lk','w1ip','single','cpu'),('lk','w1','single','cpu')):
    for path in ('run','dup','pk'):
        rat=[]
        for (gg,pp,rd),t in sorted(d.items()):
            if gg!=g or pp!=path or a not in t or b not in t: continue
            if kind=='tps': rat.append(float(t[a]['tps'])/float(t[b]['tps']))
            else: rat.append(cpu(t[a])/cpu(t[b]))
        if rat: print(g,path,a,'/',b,kind,'median %.3f'%st.median(rat),' '.join('%.2f'%x for x in rat))
