import sys, statistics as st
for f in sys.argv[1:]:
    rows=[tuple(float(x) for x in l.split()) for l in open(f)]
    dec=[r for r in rows if r[3]==1 and r[2]<0.2]
    print(f, len(dec), "step p50 %.1f graphs p50 %.1f mean %.1f outside p50 %.2f" % (st.median([r[1]*1e3 for r in dec]), st.median([r[2]*1e3 for r in dec]), st.mean([r[2]*1e3 for r in dec]), st.median([(r[1]-r[2])*1e3 for r in dec])))
