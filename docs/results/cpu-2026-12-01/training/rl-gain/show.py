import json,sys
for name in sys.argv[1:]:
    d=f'/tmp/kzl2/{name}'
    try: r=json.load(open(d+'/result.json'))
    except Exception as e: print(name,'no result',e); continue
    rows=[json.loads(l) for l in open(d+'/metrics.jsonl')]
    acc=[round(x['accept_rate'],2) for x in rows]; dens=[round(x['information_density'],2) for x in rows]
    n=len(acc); q=max(1,n//4)
    chunks=[round(sum(acc[i:i+q])/len(acc[i:i+q]),3) for i in range(0,n,q)]
    print(name, 'before', r.get('pass_rate_before'), 'after', r.get('pass_rate'), 'steps', n, 'acc by quarter', chunks, 'dens mean', round(sum(dens)/n,2))
