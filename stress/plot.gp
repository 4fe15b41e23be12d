# Grouped bar charts of a stress/bench TSV: acquisitions per second, Redis
# round trips per acquisition and Redis CPU per acquisition (log scales), per
# scenario, for dlock, the simplest Redis lock (storm --naive), a client per
# thread and process-shared mutexes.
#
#   gnuplot -e "in='stress/results/bench-X.tsv'" stress/plot.gp
#   gnuplot -e "in='X.tsv'; out='X.png'" stress/plot.gp
#
# The PNG defaults to the TSV's name with .png. Uses pngcairo when this
# gnuplot has it (not gnuplot-nox everywhere), else the libgd png terminal.
# Zero values (mutex mode sends no Redis command) are left out of the log
# scale charts: no bar.

if (!exists("in")) {
    print "usage: gnuplot -e \"in='FILE.tsv'\" [-e \"out='FILE.png'\"] stress/plot.gp"
    exit
}
if (!exists("out")) {
    n = strlen(in)
    out = (n > 4 && in[n-3:n] eq ".tsv") ? in[1:n-4] . ".png" : in . ".png"
}

if (strstrt(GPVAL_TERMINALS, "pngcairo") > 0) {
    set terminal pngcairo size 1100,1300 font "sans,10"
} else {
    set terminal png size 1100,1300
}
set output out

set datafile separator "\t"
set datafile missing "NaN"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set boxwidth 0.9
set key outside right top
set grid ytics
set xtics nomirror
set ytics nomirror

# columns: 1 scenario, 2-5 acq/s, 6-9 round trips/acq, 10-13 CPU us/acq,
# 14-17 wait p99 us (each: dlock, naive, client-per-thread, mutex)
pos(x) = (x > 0) ? x : NaN

set multiplot layout 3,1 title "dlock bench: ".in

# log scale: the mutex is 10 to 100 times faster when every handoff crosses
# processes, which would flatten the Redis modes' bars on a linear axis
set title "acquisitions per second (log scale, higher is better)"
set ylabel "acq/s"
set logscale y
plot in every ::1 using (pos($2)):xtic(1) title "dlock" lc rgb "#1f77b4", \
     '' every ::1 using (pos($3)) title "SET NX (naive)" lc rgb "#ff7f0e", \
     '' every ::1 using (pos($4)) title "client per thread" lc rgb "#d62728", \
     '' every ::1 using (pos($5)) title "mutex (no Redis)" lc rgb "#7f7f7f"

set title "Redis round trips per acquisition (log scale, lower is better; mutex: none)"
set ylabel "round trips / acq"
plot in every ::1 using (pos($6)):xtic(1) title "dlock" lc rgb "#1f77b4", \
     '' every ::1 using (pos($7)) title "SET NX (naive)" lc rgb "#ff7f0e", \
     '' every ::1 using (pos($8)) title "client per thread" lc rgb "#d62728", \
     '' every ::1 using (pos($9)) title "mutex (no Redis)" lc rgb "#7f7f7f"

set title "Redis CPU per acquisition (log scale, lower is better; mutex: idle server)"
set ylabel "us / acq"
plot in every ::1 using (pos($10)):xtic(1) title "dlock" lc rgb "#1f77b4", \
     '' every ::1 using (pos($11)) title "SET NX (naive)" lc rgb "#ff7f0e", \
     '' every ::1 using (pos($12)) title "client per thread" lc rgb "#d62728", \
     '' every ::1 using (pos($13)) title "mutex (no Redis)" lc rgb "#7f7f7f"

unset multiplot
set output
print "wrote ".out
