# The many-threads curve of a stress/bench TSV that has the "storm" family
# (storm-PxT rows): dlock's throughput as a fraction of the mutex's, and
# both wait p99s, against threads per process, one line per process count.
#
#   gnuplot -e "in='stress/results/bench-X.tsv'" stress/plot-storm.gp
#   gnuplot -e "in='X.tsv'; out='X-storm.png'" stress/plot-storm.gp
#
# The PNG defaults to the TSV's name with -storm.png.

if (!exists("in")) {
    print "usage: gnuplot -e \"in='FILE.tsv'\" [-e \"out='FILE.png'\"] stress/plot-storm.gp"
    exit
}
if (!exists("out")) {
    n = strlen(in)
    out = (n > 4 && in[n-3:n] eq ".tsv") ? in[1:n-4] . "-storm.png" : in . "-storm.png"
}
if (strstrt(GPVAL_TERMINALS, "pngcairo") > 0) {
    set terminal pngcairo size 1000,900 font "sans,10"
} else {
    set terminal png size 1000,900
}
set output out

# rows(p): threads, dlock/mutex acq/s, wait p99 of dlock and of the mutex in
# ms, for the storm-<p>xT rows, by threads; columns found by their header.
rows(p) = sprintf("< awk -F'\t' 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next } $1 ~ /^storm-%dx/ { split(substr($1, 7), a, \"x\"); print a[2], $c[\"acq_s:dlock\"] / $c[\"acq_s:mutex\"], $c[\"wait_p99_us:dlock\"] / 1000, $c[\"wait_p99_us:mutex\"] / 1000 }' '%s' | sort -n", p, in)

c1 = "#1f77b4"; c2 = "#2ca02c"; c4 = "#9467bd"
set key outside right top
set grid
set logscale x 2
set xlabel "threads per process"
set xtics (16, 64, 256, 1024)
set multiplot layout 2,1 title "one name, cs 50 us busy, think 1 ms: dlock beside a process-shared mutex"

set title "dlock acquisitions per second / the mutex's (higher is better)"
set ylabel "dlock / mutex"
set yrange [0:1.2]
plot 1 notitle lc rgb "#7f7f7f" dt 2, \
     0.9 title "0.9x" lc rgb "#d62728" dt 2, \
     rows(1) using 1:2 with linespoints lw 2 pt 7 lc rgb c1 title "1 process", \
     rows(2) using 1:2 with linespoints lw 2 pt 5 lc rgb c2 title "2 processes", \
     rows(4) using 1:2 with linespoints lw 2 pt 9 lc rgb c4 title "4 processes"

set title "wait p99 (log scale, lower is better)"
set ylabel "ms"
set autoscale y
set logscale y
plot rows(1) using 1:3 with linespoints lw 2 pt 7 lc rgb c1 title "dlock, 1 process", \
     rows(1) using 1:4 with linespoints lw 1 pt 6 lc rgb c1 dt 2 title "mutex, 1 process", \
     rows(2) using 1:3 with linespoints lw 2 pt 5 lc rgb c2 title "dlock, 2 processes", \
     rows(2) using 1:4 with linespoints lw 1 pt 4 lc rgb c2 dt 2 title "mutex, 2 processes", \
     rows(4) using 1:3 with linespoints lw 2 pt 9 lc rgb c4 title "dlock, 4 processes", \
     rows(4) using 1:4 with linespoints lw 1 pt 8 lc rgb c4 dt 2 title "mutex, 4 processes"

unset multiplot
set output
print "wrote ".out
